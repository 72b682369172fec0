package train

import (
	"context"
	"testing"

	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
)

// A server's listen address must be its address in the server list, up to listening on every
// interface or another name of the same host.
func TestCheckListen(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		listen, addr string
		ok           bool
	}{
		{"127.0.0.1:7001", "127.0.0.1:7001", true},
		{":7001", "ps0.example:7001", true},
		{"0.0.0.0:7001", "10.1.2.3:7001", true},
		{"[::]:7001", "10.1.2.3:7001", true},
		{"localhost:7001", "127.0.0.1:7001", true},
		{"127.0.0.1:7001", "127.0.0.1:7002", false},
		{":7001", "10.1.2.3:7002", false},
		{"127.0.0.1:0", "127.0.0.1:7001", false},
		{"127.0.0.1:7001", "10.1.2.3:7001", false},
	} {
		err := checkListen(ctx, tc.listen, ps.Node{ID: "ps-0", Addr: tc.addr})
		if tc.ok {
			assert.NoError(t, err, "-listen %s, -servers ps-0=%s", tc.listen, tc.addr)
			continue
		}
		assert.ErrorIs(t, err, ErrConfig, "-listen %s, -servers ps-0=%s", tc.listen, tc.addr)
		assert.ErrorContains(t, err, tc.addr)
	}
}
