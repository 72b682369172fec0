package ps_test

import (
	"context"
	"fmt"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
)

// Two servers on an in-memory network; a client pulls rows, pushes gradients and pulls again.
func Example() {
	ctx := context.Background()
	secret := []byte("cluster secret: 32 random bytes!")
	net := memnet.New(memnet.Config{})
	spec := ps.TableSpec{Name: "user", Config: embedding.Config{
		Dim: 2, Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1},
		Init: embedding.Init{Kind: embedding.InitZeros},
	}}
	var nodes []ps.Node
	var servers []*ps.Server
	for _, id := range []string{"ps-a", "ps-b"} {
		srv, _ := ps.NewServer(ps.ServerConfig{ID: id, Secret: secret, Tables: []ps.TableSpec{spec}})
		l, _ := net.Host(id).Listen(id + ":1")
		go srv.Serve(l)
		defer srv.Close()
		servers = append(servers, srv)
		nodes = append(nodes, ps.Node{ID: id, Addr: l.Addr().String()})
	}
	table, _ := ps.NewOwnerTable(1, ps.DefaultSlots, nodes, nil)
	for _, s := range servers {
		s.SetOwnerTable(table)
	}
	holder := &ps.TableHolder{}
	holder.Set(table)

	cli, _ := ps.NewClient(ps.ClientConfig{Secret: secret, Transport: net.Host("worker"), Resolver: holder})
	defer cli.Close()
	ids := []uint64{1, 2, 3, 1}
	rows := make([]float32, len(ids)*2)
	if err := cli.Pull(ctx, "user", ids, rows); err != nil {
		fmt.Println(err)
		return
	}
	grads := []float32{1, 0, 0, 1, 1, 1, 1, 0} // id 1 twice: its gradients are summed
	if err := cli.Push(ctx, "user", ids, grads, 1); err != nil {
		fmt.Println(err)
		return
	}
	cli.Pull(ctx, "user", ids, rows)
	fmt.Println(rows)
	st, _ := cli.Stats(ctx, nodes[0].Addr, false)
	fmt.Println(st.Tables[0].Name, st.Pulls+st.Pushes > 0)
	// Output:
	// [-2 0 0 -1 -1 -1 -2 0]
	// user true
}
