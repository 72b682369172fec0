package memnet_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/elasticps/elasticps/internal/transport/memnet"
)

func Example() {
	n := memnet.New(memnet.Config{})
	l, _ := n.Host("ps-0").Listen("ps-0:7000")
	defer l.Close()
	worker := n.Host("worker-0")

	n.Partition("worker-0", "ps-0")
	_, err := worker.Dial(context.Background(), "ps-0:7000")
	fmt.Println(errors.Is(err, memnet.ErrUnreachable))

	n.Heal("worker-0", "ps-0")
	c, err := worker.Dial(context.Background(), "ps-0:7000")
	fmt.Println(err)
	_ = c.Close()

	n.Kill("ps-0")
	_, err = worker.Dial(context.Background(), "ps-0:7000")
	fmt.Println(errors.Is(err, memnet.ErrRefused))
	// Output:
	// true
	// <nil>
	// true
}
