package pstest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
)

// Secret returns the cluster secret of test clusters.
func Secret() []byte { return []byte("the pstest cluster secret, 32 B.") }

// Cluster is n servers on one in-memory network.
type Cluster struct {
	T       testing.TB
	Net     *memnet.Network
	Servers []*ps.Server
	Addrs   []string
	Holder  *ps.TableHolder
	Slots   int

	wg   sync.WaitGroup
	ls   []net.Listener
	opts Options
}

// AddServer starts one more server, id on host id, with no owner table yet, and returns it
// with its node for owner tables.
func (c *Cluster) AddServer(id string) (*ps.Server, ps.Node) {
	c.T.Helper()
	o := c.opts
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: Secret(), Slots: o.Slots, Tables: o.Tables, SyncWorkers: o.SyncWorkers, Protection: o.Protection, Transport: c.Net.Host(id), TLS: o.TLS})
	if err != nil {
		c.T.Fatal(err)
	}
	l, err := c.Net.Host(id).Listen(id + ":1")
	if err != nil {
		c.T.Fatal(err)
	}
	c.Servers = append(c.Servers, srv)
	c.Addrs = append(c.Addrs, l.Addr().String())
	c.ls = append(c.ls, l)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		srv.Serve(l)
	}()
	return srv, ps.Node{ID: id, Addr: l.Addr().String()}
}

// Node returns the owner-table node of the server called id (started by New or AddServer).
func (c *Cluster) Node(id string) ps.Node {
	for i, s := range c.Servers {
		if s.ID() == id {
			return ps.Node{ID: id, Addr: c.Addrs[i]}
		}
	}
	c.T.Fatalf("no server %q", id)
	return ps.Node{}
}

// Server returns the server called id, or nil.
func (c *Cluster) Server(id string) *ps.Server {
	for _, s := range c.Servers {
		if s.ID() == id {
			return s
		}
	}
	return nil
}

// Migrator returns a migrator on host "coordinator", closed at the end of the test.
func (c *Cluster) Migrator(cfg ps.MigratorConfig) *ps.Migrator {
	c.T.Helper()
	cfg.Secret = Secret()
	cfg.Transport = c.Net.Host("coordinator")
	if cfg.TLS == nil && c.opts.TLS != nil {
		cfg.TLS = c.opts.TLS.Client
	}
	m, err := ps.NewMigrator(cfg)
	if err != nil {
		c.T.Fatal(err)
	}
	c.T.Cleanup(func() { m.Close() })
	return m
}

// PublishTo is a ps.Publish for a Migrator: it records t in Holder, then installs it on every
// server t names (the servers of t's nodes that are running).
func (c *Cluster) PublishTo(ctx context.Context, t *ps.OwnerTable) error {
	c.Holder.Set(t)
	for _, n := range t.Nodes {
		if s := c.Server(n.ID); s != nil {
			if _, err := s.SetOwnerTable(t); err != nil {
				return err
			}
		}
	}
	return nil
}

// Options adjust a cluster.
type Options struct {
	Slots       int            // default 64: small tables keep tests fast
	Tables      []ps.TableSpec // hosted by every server
	SyncWorkers int
	Protection  ps.Protection // of the servers' frames; default ps.ProtectIntegrity
	TLS         *ps.TLS       // mutual TLS for servers, clients and migrators (see TLS); nil: none
}

// New starts n servers "ps-0".."ps-(n-1)" (hosts of the same names), publishes an owner table of
// version 1 to them and to Holder, and stops everything at the end of the test.
func New(t testing.TB, n int, o Options) *Cluster {
	t.Helper()
	if o.Slots == 0 {
		o.Slots = 64
	}
	c := &Cluster{T: t, Net: memnet.New(memnet.Config{}), Holder: &ps.TableHolder{}, Slots: o.Slots}
	c.opts = o
	var nodes []ps.Node
	for i := 0; i < n; i++ {
		_, node := c.AddServer(fmt.Sprintf("ps-%d", i))
		nodes = append(nodes, node)
	}
	table, err := ps.NewOwnerTable(1, o.Slots, nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Publish(table)
	t.Cleanup(c.Close)
	return c
}

// Publish gives table to every server and to Holder.
func (c *Cluster) Publish(table *ps.OwnerTable) {
	for _, s := range c.Servers {
		if _, err := s.SetOwnerTable(table); err != nil {
			c.T.Fatal(err)
		}
	}
	c.Holder.Set(table)
}

// Client returns a client on host name ("worker-0", ...) resolving tables through Holder
// (or, with fromServers, by asking the servers). It is closed at the end of the test.
func (c *Cluster) Client(name string, cfg ps.ClientConfig) *ps.Client {
	c.T.Helper()
	cfg.Secret = Secret()
	cfg.Transport = c.Net.Host(name)
	if cfg.TLS == nil && c.opts.TLS != nil {
		cfg.TLS = c.opts.TLS.Client
	}
	if cfg.Resolver == nil && len(cfg.Servers) == 0 {
		cfg.Resolver = c.Holder
	}
	cl, err := ps.NewClient(cfg)
	if err != nil {
		c.T.Fatal(err)
	}
	c.T.Cleanup(func() { cl.Close() })
	return cl
}

// Close stops every server and waits for them.
func (c *Cluster) Close() {
	for _, s := range c.Servers {
		s.Close()
	}
	c.wg.Wait()
}

// Context returns a context for test calls.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
