package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/elasticps/elasticps/internal/rpc"
)

// moveFloor measures the least a moved row can cost on this machine: what a migration does with
// a row's bytes and nothing else. A server reads every third record of a slab larger than the
// cache (as a source whose rows are a third in the moving slots reads them), into chunks of the
// size the migrations use; a client fetches the chunks over authenticated loopback connections,
// configured as the servers' peer connections are, and copies every record into a cold slab of
// its own. Two such streams run at once, each on its own connection, as the two sources of a
// scale-out do. There is no table work: no scan, no index, no deletion. Its CPU per row, against
// the pull's, is the floor of move_cpu_vs_pull_cpu.
type moveFloor struct {
	rec       int
	src, dst  []byte // the sources' rows, the destinations' rows
	perStream int    // records each stream moves
	srv       *rpc.Server
	cli       *rpc.Client
	addrs     []string // one listener per stream
	serving   sync.WaitGroup
}

// floorStreams is how many migrations run at once in the floor, one per source of a 2 -> 3
// scale-out.
const floorStreams = 2

// methodFloorCopy is the floor's only method: the request is the stream (uint32) and the first
// record (uint32) of the chunk; the answer is the records.
const methodFloorCopy = 1

func newMoveFloor(secret []byte, rec, perStream int) (*moveFloor, error) {
	f := &moveFloor{rec: rec, perStream: perStream}
	// Slabs filled with bytes that are not zero: a page never written reads as the shared zero
	// page, always in cache.
	f.src = make([]byte, floorStreams*3*perStream*rec)
	f.dst = make([]byte, floorStreams*perStream*rec)
	for _, b := range [][]byte{f.src, f.dst} {
		for i := 0; i < len(b); i += 64 {
			b[i] = byte(i>>6) | 1
		}
	}
	var err error
	f.srv, err = rpc.NewServer(rpc.ServerConfig{Secret: secret, MaxFrameSize: 256 << 20})
	if err != nil {
		return nil, err
	}
	if err := f.srv.Register(methodFloorCopy, f.handle); err != nil {
		f.close()
		return nil, err
	}
	for range floorStreams {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.close()
			return nil, err
		}
		f.addrs = append(f.addrs, l.Addr().String())
		f.serving.Add(1)
		go func() { defer f.serving.Done(); f.srv.Serve(l) }()
	}
	f.cli, err = rpc.NewClient(rpc.ClientConfig{Secret: secret, ConnsPerAddr: 1, MaxFrameSize: 256 << 20})
	if err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// close stops the floor's server and client and drops its slabs. It may be called again.
func (f *moveFloor) close() {
	if f.cli != nil {
		f.cli.Close()
	}
	f.srv.Close()
	f.serving.Wait()
	f.src, f.dst = nil, nil
}

// budget is the records' bytes per chunk: what a migration's destination asks for by default
// (4 MiB less the frame's cursor, tag and one record of slack).
func (f *moveFloor) budget() int { return 4<<20 - 64 - f.rec }

// handle answers a chunk: every third record of the stream's part of src, from the one asked.
func (f *moveFloor) handle(_ context.Context, req []byte, resp *rpc.Buffer) error {
	if len(req) != 8 {
		return errors.New("floor: bad request")
	}
	stream, first := int(binary.LittleEndian.Uint32(req)), int(binary.LittleEndian.Uint32(req[4:]))
	n := min(f.budget()/f.rec, f.perStream-first)
	if stream >= floorStreams || n <= 0 {
		return errors.New("floor: no such chunk")
	}
	out := resp.Extend(n * f.rec)
	base := stream * 3 * f.perStream
	for k := range n {
		r := base + 3*(first+k)
		copy(out[k*f.rec:(k+1)*f.rec], f.src[r*f.rec:(r+1)*f.rec])
	}
	return nil
}

// run moves every stream's records once, the streams at once, and returns the records moved.
// With rate > 0 the streams together move at most rate records per second: a chunk waits for its
// time.
func (f *moveFloor) run(ctx context.Context, rate float64) (int, error) {
	g, ctx := errgroup.WithContext(ctx)
	start := time.Now()
	for stream := range floorStreams {
		g.Go(func() error {
			req := make([]byte, 8)
			dst := f.dst[stream*f.perStream*f.rec : (stream+1)*f.perStream*f.rec]
			for first := 0; first < f.perStream; {
				if rate > 0 {
					due := start.Add(time.Duration(float64(first) / (rate / floorStreams) * float64(time.Second)))
					sleepCtx(ctx, time.Until(due))
				}
				binary.LittleEndian.PutUint32(req, uint32(stream))
				binary.LittleEndian.PutUint32(req[4:], uint32(first))
				resp, err := f.cli.Call(ctx, f.addrs[stream], methodFloorCopy, req)
				if err != nil {
					return err
				}
				if len(resp) == 0 || len(resp)%f.rec != 0 {
					return fmt.Errorf("floor: answer of %d bytes", len(resp))
				}
				for k := 0; k < len(resp); k += f.rec {
					copy(dst[first*f.rec:(first+1)*f.rec], resp[k:k+f.rec])
					first++
				}
				f.cli.Release(resp)
			}
			return nil
		})
	}
	return floorStreams * f.perStream, g.Wait()
}
