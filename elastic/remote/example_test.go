package remote_test

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/ps"
)

// A parameter server's process serves its side of the protocol on its one RPC port, and a
// coordinator in another process drives it through a remote.Server: it admits the incarnation
// that answers, leads it, and installs an owner table. A coordinator superseded by a later one
// is refused, and the server's sentinels keep their identity across the wire.
func Example() {
	ctx := context.Background()
	secret := []byte("the cluster secret of the example")

	// The server's process.
	srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: secret, Slots: 8})
	if err != nil {
		panic(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s, err := server.New(srv, l.Addr().String(), checkpoint.Config{}) // no checkpoint storage
	if err != nil {
		panic(err)
	}
	if err := remote.ServeServer(srv, s); err != nil {
		panic(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() {
		srv.Close()
		<-served
		s.Close()
	}()

	// The coordinator's process.
	rs, err := remote.NewServer(s.Node(), remote.Config{Secret: secret})
	if err != nil {
		panic(err)
	}
	defer rs.Close()
	h, err := rs.Health(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("the incarnation that runs answers: %v; owner table version %d\n", h.Incarnation == s.Incarnation(), h.TableVersion)
	rs.Admit(h.Incarnation)
	if err := rs.Lead(ctx, 2<<32); err != nil {
		panic(err)
	}
	owners, err := ps.NewOwnerTable(1, 8, []ps.Node{rs.Node()}, nil)
	if err != nil {
		panic(err)
	}
	if err := rs.InstallTable(ctx, owners); err != nil {
		panic(err)
	}
	t, err := rs.Table(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("owner table version %d: slot 5 on %s\n", t.Version, t.Owner(5).ID)

	// A coordinator of an earlier incarnation, and a server without checkpoint storage.
	earlier, err := remote.NewServer(s.Node(), remote.Config{Secret: secret})
	if err != nil {
		panic(err)
	}
	defer earlier.Close()
	err = earlier.Lead(ctx, 1<<32)
	fmt.Println("an earlier coordinator is superseded:", errors.Is(err, elastic.ErrSuperseded))
	_, err = rs.WaitPersisted(ctx, 1)
	fmt.Println("no checkpoints:", errors.Is(err, server.ErrNoCheckpoints))
	// Output:
	// the incarnation that runs answers: true; owner table version 0
	// owner table version 1: slot 5 on ps-0
	// an earlier coordinator is superseded: true
	// no checkpoints: true
}
