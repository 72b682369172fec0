package memnet

import (
	"fmt"
	"net"
	"sync"
)

// listener implements net.Listener for one address.
type listener struct {
	n    *Network
	host *Host
	addr Addr

	mu     sync.Mutex
	wake   chan struct{}
	queue  []*conn
	closed bool
}

var _ net.Listener = (*listener)(nil)

// enqueue hands a new connection to Accept; false if the listener is closed.
func (l *listener) enqueue(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.queue = append(l.queue, c)
	close(l.wake)
	l.wake = make(chan struct{})
	return true
}

// Accept waits for the next connection.
func (l *listener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.closed {
			return nil, fmt.Errorf("accept %s: %w", l.addr, net.ErrClosed)
		}
		if len(l.queue) > 0 {
			c := l.queue[0]
			l.queue[0] = nil
			l.queue = l.queue[1:]
			return c, nil
		}
		ch := l.wake
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
}

// Close stops listening; connections dialed but not yet accepted are reset.
func (l *listener) Close() error {
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	if l.n.listeners[l.addr] == l {
		delete(l.n.listeners, l.addr)
	}
	for _, c := range l.shut() {
		l.n.resetPairLocked(c.p)
	}
	return nil
}

// shut marks the listener closed, wakes Accept and returns the connections
// that were never accepted.
func (l *listener) shut() []*conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	q := l.queue
	l.queue = nil
	close(l.wake)
	l.wake = make(chan struct{})
	return q
}

// Addr returns the listening address.
func (l *listener) Addr() net.Addr { return l.addr }
