package rpc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/transport/memnet"
)

const (
	methodPull uint16 = 1

	codeWrongOwner = rpc.MinAppCode
)

// Example runs a server and a client on an in-memory network: a pull of
// float rows carried as raw little-endian bytes, a typed application error,
// and a call that fails fast because the server's host was killed.
func Example() {
	secret := []byte("cluster secret: 32 random bytes!")
	network := memnet.New(memnet.Config{})

	srv, err := rpc.NewServer(rpc.ServerConfig{Secret: secret})
	if err != nil {
		fmt.Println(err)
		return
	}
	const dim = 4
	_ = srv.Register(methodPull, func(_ context.Context, req []byte, resp *rpc.Buffer) error {
		if len(req)%8 != 0 {
			return &rpc.RemoteError{Code: rpc.CodeInternal, Message: "ids must be uint64"}
		}
		out := resp.Extend(len(req) / 8 * dim * 4) // filled in place
		for i := 0; i < len(req)/8; i++ {
			id := binary.LittleEndian.Uint64(req[8*i:])
			if id >= 100 {
				version := binary.LittleEndian.AppendUint64(nil, 7)
				return &rpc.RemoteError{Code: codeWrongOwner, Message: "not my slot", Data: version}
			}
			for j := range dim {
				binary.LittleEndian.PutUint32(out[(i*dim+j)*4:], math.Float32bits(float32(id)+float32(j)/10))
			}
		}
		return nil
	})
	l, _ := network.Host("ps-0").Listen("ps-0:7000")
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	cli, err := rpc.NewClient(rpc.ClientConfig{Secret: secret, Transport: network.Host("worker-0")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	req := binary.LittleEndian.AppendUint64(nil, 3)
	req = binary.LittleEndian.AppendUint64(req, 42)
	resp, err := cli.Call(ctx, "ps-0:7000", methodPull, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	for r := 0; r < 2; r++ {
		row := make([]float32, dim)
		for j := range row {
			row[j] = math.Float32frombits(binary.LittleEndian.Uint32(resp[(r*dim+j)*4:]))
		}
		fmt.Println(row)
	}
	cli.Release(resp)

	_, err = cli.Call(ctx, "ps-0:7000", methodPull, binary.LittleEndian.AppendUint64(nil, 500))
	var re *rpc.RemoteError
	if errors.As(err, &re) && re.Code == codeWrongOwner {
		fmt.Println("wrong owner, table version", binary.LittleEndian.Uint64(re.Data))
	}

	network.Kill("ps-0")
	_, err = cli.Call(ctx, "ps-0:7000", methodPull, req)
	fmt.Println(errors.Is(err, rpc.ErrUnavailable) || errors.Is(err, rpc.ErrConnClosed))

	_ = srv.Close()
	<-served
	// Output:
	// [3 3.1 3.2 3.3]
	// [42 42.1 42.2 42.3]
	// wrong owner, table version 7
	// true
}
