package memnet

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// chunk is bytes written by one Write (or the part of it that fitted in the
// window), readable from at on.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe is one direction of a connection: bytes written by one end and read by
// the other. All fields are guarded by mu; wake is closed and replaced on
// every change so that blocked readers and writers re-check their condition.
type pipe struct {
	mu     sync.Mutex
	wake   chan struct{}
	chunks []chunk
	head   int // bytes of chunks[0] already read
	queued int // bytes in chunks not yet read
	window int

	delay    time.Duration // added to each chunk's delivery time
	held     bool          // partitioned: nothing is delivered until healed
	dropping bool          // writes are silently discarded
	broken   bool          // bytes were discarded: nothing written later is delivered

	readerClosed bool  // the reading end was closed: its Reads fail, Writes to it fail
	writerClosed bool  // the writing end was closed: Reads drain then see EOF
	reset        error // connection reset: every operation of the surviving ends fails with it

	rdl time.Time // read deadline of the reading end
	wdl time.Time // write deadline of the writing end
}

func newPipe(window int) *pipe {
	return &pipe{wake: make(chan struct{}), window: window}
}

// broadcastLocked wakes every goroutine waiting on p.
func (p *pipe) broadcastLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// waitLocked releases p.mu until p changes or until is reached (zero: no
// time limit), then takes it again.
func (p *pipe) waitLocked(until time.Time) {
	ch := p.wake
	p.mu.Unlock()
	if until.IsZero() {
		<-ch
	} else {
		t := time.NewTimer(time.Until(until))
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
	p.mu.Lock()
}

func (p *pipe) read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.readerClosed {
			return 0, net.ErrClosed
		}
		if p.reset != nil {
			return 0, p.reset
		}
		if len(b) == 0 {
			return 0, nil
		}
		now := time.Now()
		if !p.rdl.IsZero() && !now.Before(p.rdl) {
			return 0, os.ErrDeadlineExceeded
		}
		until := p.rdl
		if len(p.chunks) == 0 {
			if p.writerClosed {
				return 0, io.EOF
			}
		} else if !p.held {
			if n := p.takeLocked(b, now); n > 0 {
				p.broadcastLocked()
				return n, nil
			}
			if at := p.chunks[0].at; until.IsZero() || at.Before(until) {
				until = at
			}
		}
		p.waitLocked(until)
	}
}

// takeLocked copies bytes of chunks due by now into b and returns how many.
func (p *pipe) takeLocked(b []byte, now time.Time) int {
	n := 0
	for n < len(b) && len(p.chunks) > 0 && !now.Before(p.chunks[0].at) {
		c := &p.chunks[0]
		k := copy(b[n:], c.b[p.head:])
		n += k
		p.head += k
		if p.head == len(c.b) {
			c.b = nil
			p.chunks = p.chunks[1:]
			p.head = 0
		}
	}
	p.queued -= n
	if len(p.chunks) == 0 {
		p.chunks = nil
	}
	return n
}

func (p *pipe) write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for {
		if p.writerClosed {
			return n, net.ErrClosed
		}
		if p.reset != nil {
			return n, p.reset
		}
		if p.readerClosed {
			return n, ErrBrokenPipe
		}
		if len(b) == 0 {
			return n, nil
		}
		now := time.Now()
		if !p.wdl.IsZero() && !now.Before(p.wdl) {
			return n, os.ErrDeadlineExceeded
		}
		if p.dropping || p.broken {
			// The bytes vanish; the writer cannot tell. Once a byte is
			// lost the stream has a gap, so nothing after it is delivered.
			p.broken = true
			return n + len(b), nil
		}
		space := p.window - p.queued
		if space <= 0 {
			p.waitLocked(p.wdl)
			continue
		}
		k := min(space, len(b))
		p.chunks = append(p.chunks, chunk{b: append([]byte(nil), b[:k]...), at: now.Add(p.delay)})
		p.queued += k
		n += k
		b = b[k:]
		p.broadcastLocked()
	}
}

// update runs f with p locked and wakes p's waiters.
func (p *pipe) update(f func(p *pipe)) {
	p.mu.Lock()
	f(p)
	p.broadcastLocked()
	p.mu.Unlock()
}

func (p *pipe) closeReader() {
	p.update(func(p *pipe) {
		p.readerClosed = true
		p.chunks, p.head, p.queued = nil, 0, 0
	})
}

func (p *pipe) closeWriter() { p.update(func(p *pipe) { p.writerClosed = true }) }

func (p *pipe) resetWith(err error) {
	p.update(func(p *pipe) {
		if p.reset == nil {
			p.reset = err
		}
		p.chunks, p.head, p.queued = nil, 0, 0
	})
}
