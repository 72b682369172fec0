package pstest_test

import (
	"fmt"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
)

// A test starts two servers, pulls a row through a client and partitions a server away.
func Example() {
	t := &testing.T{} // in a real test, the test's own *testing.T
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}}})
	defer c.Close()
	cl := c.Client("worker-0", ps.ClientConfig{})
	defer cl.Close()
	rows := make([]float32, 2)
	fmt.Println(cl.Pull(pstest.Context(t), "emb", []uint64{7}, rows), len(c.Servers))
	// Output: <nil> 2
}
