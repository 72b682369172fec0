package train

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// embPrefix starts the server-side name of every embedding table (one per sparse field).
const embPrefix = "emb."

// tableSpecs returns the embedding tables of the model: one per sparse field, each seeded
// differently so that equal ids of two fields start from different rows.
func tableSpecs(fields []string, dim int, seed uint64, opt embedding.Optimizer, scale float32) []ps.TableSpec {
	specs := make([]ps.TableSpec, len(fields))
	for f, name := range fields {
		specs[f] = ps.TableSpec{Name: embPrefix + name, Config: embedding.Config{
			Name: embPrefix + name, Dim: dim, Seed: seed + uint64(f+1)*0x9e3779b97f4a7c15,
			Optimizer: opt, Init: embedding.Init{Kind: embedding.InitUniform, Scale: scale},
		}}
	}
	return specs
}

// servers is a set of parameter servers of this process, each serving on its own loopback TCP
// port with the cluster secret, and the owner table that places slots on them.
type servers struct {
	secret []byte
	list   []*ps.Server
	nodes  []ps.Node
	table  *ps.OwnerTable
	holder *ps.TableHolder
	logger *slog.Logger
	wg     sync.WaitGroup
}

// startServers starts n servers hosting specs on 127.0.0.1 (ports chosen by the system).
func startServers(n, slots int, secret []byte, specs []ps.TableSpec, logger *slog.Logger) (*servers, error) {
	s := &servers{secret: secret, holder: &ps.TableHolder{}, logger: logger}
	for i := range n {
		srv, err := ps.NewServer(ps.ServerConfig{ID: fmt.Sprintf("ps-%d", i), Secret: secret, Slots: slots, Tables: specs, Logger: logger})
		if err != nil {
			s.Close()
			return nil, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			srv.Close()
			s.Close()
			return nil, err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.Serve(l); err != nil {
				logger.Error("parameter server stopped", "server", srv.ID(), "err", err)
			}
		}()
		s.list = append(s.list, srv)
		s.nodes = append(s.nodes, ps.Node{ID: srv.ID(), Addr: l.Addr().String()})
	}
	table, err := ps.NewOwnerTable(1, slots, s.nodes, nil)
	if err != nil {
		s.Close()
		return nil, err
	}
	for _, srv := range s.list {
		if _, err := srv.SetOwnerTable(table); err != nil {
			s.Close()
			return nil, err
		}
	}
	s.table = table
	s.holder.Set(table)
	return s, nil
}

// client returns a client of the servers for worker index w.
func (s *servers) client(w int) (*ps.Client, error) {
	return ps.NewClient(ps.ClientConfig{Secret: s.secret, Resolver: s.holder, Worker: w, Logger: s.logger})
}

// owned returns the slots server i owns.
func (s *servers) owned(i int) []int {
	set := s.table.SlotsOf(s.list[i].ID())
	out := make([]int, 0, set.Len())
	for slot := range s.table.Slots {
		if set.Has(slot) {
			out = append(out, slot)
		}
	}
	return out
}

// ownerOf returns the server holding the dense tensor name.
func (s *servers) ownerOf(name string) *ps.Server {
	id := s.table.Owner(s.table.NameSlot(name)).ID
	for _, srv := range s.list {
		if srv.ID() == id {
			return srv
		}
	}
	return nil
}

// Close stops every server and waits for them.
func (s *servers) Close() error {
	var errs []error
	for _, srv := range s.list {
		errs = append(errs, srv.Close())
	}
	s.wg.Wait()
	return errors.Join(errs...)
}
