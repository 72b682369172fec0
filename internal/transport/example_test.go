package transport_test

import (
	"context"
	"fmt"
	"io"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/transport/memnet"
)

func Example() {
	// Code written against Transport runs unchanged over TCP or in memory.
	var tr transport.Transport = memnet.New(memnet.Config{}).Host("a")
	l, err := tr.Listen("a:1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()

	c, err := tr.Dial(context.Background(), "a:1")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = c.Write([]byte("ping"))
	buf := make([]byte, 4)
	_, _ = io.ReadFull(c, buf)
	fmt.Println(string(buf))
	_ = c.Close()
	<-done
	// Output: ping
}
