package process_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/process"
)

// A job's processes on this host: a parameter server that runs until it is stopped, and two
// workers whose data is done at once (status 0: done, never restarted). Every process here is
// /bin/sh; a real job runs its own program with its role's flags.
func Example() {
	ctx := context.Background()
	s, err := process.New(process.Config{
		Binary: "/bin/sh",
		Args: func(l process.Launch) []string {
			if l.Role == elastic.RoleWorker {
				return []string{"-c", "exit 0"}
			}
			return []string{"-c", "exec sleep 600"}
		},
	})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	if err := s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 2}); err != nil {
		panic(err)
	}
	for _, id := range []string{elastic.WorkerID(0), elastic.WorkerID(1)} {
		fmt.Println(id, "done:", s.Wait(ctx, id))
	}
	err = s.Scale(ctx, elastic.Plan{Servers: 2, Workers: 2})
	fmt.Println("Scale keeps the servers:", errors.Is(err, elastic.ErrInvalidConfig))
	for _, p := range s.Processes() {
		fmt.Println(p.ID, p.Role, "running:", p.Running, "done:", p.Done)
	}
	if err := s.Close(); err != nil {
		panic(err)
	}
	fmt.Println("ps-0 stopped:", errors.Is(s.Wait(ctx, elastic.ServerID(0)), process.ErrProcessStopped))
	// Output:
	// worker-0 done: <nil>
	// worker-1 done: <nil>
	// Scale keeps the servers: true
	// ps-0 ps running: true done: false
	// worker-0 worker running: false done: true
	// worker-1 worker running: false done: true
	// ps-0 stopped: true
}
