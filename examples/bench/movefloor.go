package main

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// moveFloor measures the least a moved row can cost on this machine: what any migration must do
// with a row's bytes, and nothing else. A source reads every third record of a slab larger than
// the cache (as a server whose rows are a third in the moving slots reads them) into a chunk of
// the size the migrations use, and sends it over loopback TCP with an AES-GCM tag over the chunk
// (the integrity protection every frame between servers carries); the destination reads the
// chunk, checks its tag and copies every record into a cold slab of its own. Two such streams
// run at once, each on its own connection, as the two sources of a scale-out do. There is no
// table work (no scan, no index, no deletion) and no request layer. Its CPU per row, against the
// pull's, is the floor of move_cpu_vs_pull_cpu.
type moveFloor struct {
	rec       int
	perStream int    // records each stream moves
	src, dst  []byte // the sources' rows, the destinations' rows
	streams   []*floorStream
	serving   sync.WaitGroup
	closeOnce sync.Once
}

// floorStream is one source and destination pair and their connection.
type floorStream struct {
	ln       net.Listener
	src, dst net.Conn // the source's end, the destination's end
	// Each end seals what it sends and opens what it receives, with the exchange's number in
	// the nonce; requests and answers differ in its first byte.
	srcAEAD, dstAEAD cipher.AEAD
	seq              uint64 // exchanges so far, as the destination counts them
}

// floorStreams is how many migrations run at once in the floor, one per source of a 2 -> 3
// scale-out.
const floorStreams = 2

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
	key := sha256.Sum256(append([]byte("elasticps bench move floor"), secret...))
	for k := range floorStreams {
		st, err := newFloorStream(key[:])
		if err != nil {
			f.close()
			return nil, err
		}
		f.streams = append(f.streams, st)
		f.serving.Add(1)
		go func() {
			defer f.serving.Done()
			f.serve(k) // ends when the connection closes; closing it fails the destination
			st.src.Close()
		}()
	}
	return f, nil
}

func newFloorStream(key []byte) (*floorStream, error) {
	st := &floorStream{}
	for _, a := range []*cipher.AEAD{&st.srcAEAD, &st.dstAEAD} {
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		if *a, err = cipher.NewGCM(block); err != nil {
			return nil, err
		}
	}
	var err error
	if st.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := st.ln.Accept()
		accepted <- c
	}()
	if st.dst, err = net.Dial("tcp", st.ln.Addr().String()); err != nil {
		st.ln.Close()
		<-accepted
		return nil, err
	}
	if st.src = <-accepted; st.src == nil {
		st.dst.Close()
		st.ln.Close()
		return nil, errors.New("floor: no connection accepted")
	}
	return st, nil
}

// close closes the connections, waits for the sources and drops the slabs. It may be called
// again.
func (f *moveFloor) close() {
	f.closeOnce.Do(func() {
		for _, st := range f.streams {
			st.src.Close()
			st.dst.Close()
			st.ln.Close()
		}
		f.serving.Wait()
		f.src, f.dst = nil, nil
	})
}

// chunkRecords is how many records a chunk holds: what a migration's destination asks for by
// default (4 MiB less the frame's cursor, tag and one record of slack).
func (f *moveFloor) chunkRecords() int { return (4<<20 - 64 - f.rec) / f.rec }

// Directions, the first byte of a nonce.
const (
	floorAsk    = 1
	floorAnswer = 2
)

// floorNonce returns the GCM nonce of exchange seq in direction dir.
func floorNonce(dir byte, seq uint64) []byte {
	n := make([]byte, 12)
	n[0] = dir
	binary.BigEndian.PutUint64(n[4:], seq)
	return n
}

// serve is stream k's source: it answers each request (the first record wanted, and its tag)
// with the chunk from there: its length, its records and their tag. It returns when the
// connection fails or a request does.
func (f *moveFloor) serve(k int) error {
	st := f.streams[k]
	req := make([]byte, 8+16)
	frame := make([]byte, 4+f.chunkRecords()*f.rec+16)
	var tag [16]byte
	base := k * 3 * f.perStream
	for seq := uint64(0); ; seq++ {
		if _, err := io.ReadFull(st.src, req); err != nil {
			return err
		}
		if _, err := st.srcAEAD.Open(nil, floorNonce(floorAsk, seq), req[8:], req[:8]); err != nil {
			return fmt.Errorf("floor: request %d: %w", seq, err)
		}
		first := int(binary.LittleEndian.Uint64(req))
		n := min(f.chunkRecords(), f.perStream-first)
		if first < 0 || n <= 0 {
			return fmt.Errorf("floor: no records from %d", first)
		}
		body := frame[4 : 4+n*f.rec]
		for i := range n {
			r := base + 3*(first+i)
			copy(body[i*f.rec:(i+1)*f.rec], f.src[r*f.rec:(r+1)*f.rec])
		}
		binary.LittleEndian.PutUint32(frame, uint32(len(body)))
		copy(frame[4+len(body):], st.srcAEAD.Seal(tag[:0], floorNonce(floorAnswer, seq), nil, body))
		if _, err := st.src.Write(frame[:4+len(body)+16]); err != nil {
			return err
		}
	}
}

// run moves every stream's records once, the streams at once, and returns the records moved.
// With rate > 0 the streams together move at most rate records per second: a chunk waits for its
// time.
func (f *moveFloor) run(ctx context.Context, rate float64) (int, error) {
	g, ctx := errgroup.WithContext(ctx)
	start := time.Now()
	for k := range f.streams {
		g.Go(func() error { return f.fetch(ctx, k, start, rate) })
	}
	return floorStreams * f.perStream, g.Wait()
}

// fetch is stream k's destination: it asks for every chunk in turn, checks its tag and copies
// its records into its part of dst.
func (f *moveFloor) fetch(ctx context.Context, k int, start time.Time, rate float64) error {
	st := f.streams[k]
	stop := context.AfterFunc(ctx, func() { st.dst.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := make([]byte, 8+16)
	buf := make([]byte, f.chunkRecords()*f.rec+16)
	var tag [16]byte
	dst := f.dst[k*f.perStream*f.rec : (k+1)*f.perStream*f.rec]
	for first := 0; first < f.perStream; st.seq++ {
		if rate > 0 {
			sleepCtx(ctx, time.Until(start.Add(time.Duration(float64(first)/(rate/floorStreams)*float64(time.Second)))))
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		binary.LittleEndian.PutUint64(req, uint64(first))
		copy(req[8:], st.dstAEAD.Seal(tag[:0], floorNonce(floorAsk, st.seq), nil, req[:8]))
		if _, err := st.dst.Write(req); err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		if _, err := io.ReadFull(st.dst, buf[:4]); err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		n := int(binary.LittleEndian.Uint32(buf))
		if n == 0 || n%f.rec != 0 || n+16 > len(buf) {
			return fmt.Errorf("floor: a chunk of %d bytes", n)
		}
		if _, err := io.ReadFull(st.dst, buf[:n+16]); err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		if _, err := st.dstAEAD.Open(nil, floorNonce(floorAnswer, st.seq), buf[n:n+16], buf[:n]); err != nil {
			return fmt.Errorf("floor: chunk %d: %w", st.seq, err)
		}
		copy(dst[first*f.rec:], buf[:n]) // the rows of a fresh slab chunk, one after another
		first += n / f.rec
	}
	return nil
}
