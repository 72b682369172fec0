package statuspage_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/statuspage"
)

// A page samples a job (here a status the example sets; in a program, the coordinator),
// takes the loss the training loop observes and the checkpoints the coordinator reports, and
// serves them; a status command reads them back with Fetch.
func Example() {
	ctx := context.Background()
	secret := []byte("the cluster secret, 32 bytes or more")
	status := elastic.Status{Job: "ctr", Phase: "training", Epochs: 1, EpochRecords: 10000,
		Servers: []elastic.ServerStatus{{ID: "ps-0", Addr: "10.0.0.5:7000"}, {ID: "ps-1", Addr: "10.0.0.6:7000"}},
		Workers: []elastic.WorkerStatus{{ID: "worker-0", Steps: 40}},
		Owners:  []string{"ps-0", "ps-1", "ps-1", "ps-0"}}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	page, err := statuspage.New(statuspage.Config{Secret: secret,
		Source: statuspage.SourceFunc(func() elastic.Status { return status }),
		Now:    func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	page.Sample(ctx)

	// A second later: 2000 records trained, a loss observed, a checkpoint taken.
	now = now.Add(time.Second)
	status.EpochDone, status.Workers[0].Steps = 2000, 80
	page.Observe("loss", 0.62)
	page.ObserveCheckpoint(elastic.CheckpointEvent{Step: 80, Bytes: 1 << 20, Blocked: 2 * time.Millisecond})
	page.Sample(ctx)

	srv := httptest.NewServer(page.Handler(true)) // Serve decides from its listener's address
	defer srv.Close()
	s, err := statuspage.Fetch(ctx, srv.URL, secret)
	if err != nil {
		panic(err)
	}
	for _, m := range s.Members {
		fmt.Printf("%s %s %s: %d slots, %.0f batches/s\n", m.Role, m.ID, m.Health, m.Slots, m.StepsPerSecond)
	}
	for _, se := range s.Series {
		fmt.Printf("%s: %g %s\n", se.Name, se.Points[len(se.Points)-1].V, cmp.Or(se.Unit, "(observed)"))
	}
	c := s.Checkpoints[0]
	fmt.Printf("checkpoint at step %d paused training for %v\n", c.Step, c.Blocked)
	_, err = statuspage.Fetch(ctx, srv.URL, []byte("not the secret"))
	fmt.Println("another secret:", errors.Is(err, statuspage.ErrUnauthorized))
	// Output:
	// server ps-0 serving: 2 slots, 0 batches/s
	// server ps-1 serving: 2 slots, 0 batches/s
	// worker worker-0 idle: 0 slots, 40 batches/s
	// throughput: 2000 records/s
	// loss: 0.62 (observed)
	// checkpoint at step 80 paused training for 2ms
	// another secret: true
}
