package membership_test

import (
	"context"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/membership"
)

// The coordinator's process starts the job's gossip on a loopback address, a worker joins it,
// each sees the other, and the worker leaves.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret := []byte("the cluster secret of the example")
	start := func(self elastic.Member, seeds ...string) (*membership.Gossip, <-chan elastic.MemberEvent) {
		events := make(chan elastic.MemberEvent, 16)
		g, err := membership.New(ctx, membership.Config{Self: self, Bind: "127.0.0.1:0", Seeds: seeds, Secret: secret,
			ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond, GossipInterval: 20 * time.Millisecond,
			OnEvent: func(ev elastic.MemberEvent) { events <- ev }})
		if err != nil {
			panic(err)
		}
		return g, events
	}
	// await returns once events has brought kind for id.
	await := func(events <-chan elastic.MemberEvent, kind elastic.MemberEventKind, id string) {
		for {
			select {
			case ev := <-events:
				if ev.Kind == kind && ev.Member.ID == id {
					return
				}
			case <-ctx.Done():
				panic(fmt.Sprintf("no %v event for %s: %v", kind, id, ctx.Err()))
			}
		}
	}
	show := func(who string, g *membership.Gossip) {
		for _, m := range g.Members() { // sorted by role, id and incarnation
			fmt.Printf("%s sees %s %s (incarnation %d) at %s on %s\n", who, m.Role, m.ID, m.Incarnation, m.Addr, m.Host)
		}
	}

	coord, coordEvents := start(elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: 1, Addr: "10.0.0.1:7000", Host: "host-a"})
	defer coord.Close()
	// The worker is given the coordinator's gossip address as its seed.
	worker, workerEvents := start(elastic.Member{Role: elastic.RoleWorker, ID: "worker-0", Incarnation: 7, Addr: "10.0.0.2:7000", Host: "host-b"}, coord.LocalAddr())
	defer worker.Close()
	await(coordEvents, elastic.MemberJoined, "worker-0")
	await(workerEvents, elastic.MemberJoined, "coordinator")
	show("the coordinator", coord)
	show("the worker", worker)
	m, ok := coord.Lookup(elastic.RoleWorker, "worker-0")
	fmt.Println("lookup:", m.Addr, ok)

	if err := worker.Leave(ctx); err != nil {
		panic(err)
	}
	await(coordEvents, elastic.MemberLeft, "worker-0")
	show("then the coordinator", coord)
	// Output:
	// the coordinator sees worker worker-0 (incarnation 7) at 10.0.0.2:7000 on host-b
	// the coordinator sees coordinator coordinator (incarnation 1) at 10.0.0.1:7000 on host-a
	// the worker sees worker worker-0 (incarnation 7) at 10.0.0.2:7000 on host-b
	// the worker sees coordinator coordinator (incarnation 1) at 10.0.0.1:7000 on host-a
	// lookup: 10.0.0.2:7000 true
	// then the coordinator sees coordinator coordinator (incarnation 1) at 10.0.0.1:7000 on host-a
}
