package statuspage

// ring keeps the newest values pushed into it, at most its capacity: the page's memory does
// not grow with the job's age.
type ring[T any] struct {
	buf  []T
	next int // where the next value goes once buf is full
	full bool
}

func newRing[T any](n int) ring[T] { return ring[T]{buf: make([]T, 0, n)} }

// push adds v, dropping the oldest value when the ring is full.
func (r *ring[T]) push(v T) {
	if !r.full {
		r.buf = append(r.buf, v)
		r.full = len(r.buf) == cap(r.buf)
		return
	}
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
}

// last returns a pointer to the newest value, nil when the ring is empty. It stays valid until
// the next push.
func (r *ring[T]) last() *T {
	if len(r.buf) == 0 {
		return nil
	}
	i := len(r.buf) - 1
	if r.full {
		i = (r.next + len(r.buf) - 1) % len(r.buf)
	}
	return &r.buf[i]
}

// len returns the number of values held.
func (r *ring[T]) len() int { return len(r.buf) }

// values returns a copy of the values, oldest first.
func (r *ring[T]) values() []T {
	out := make([]T, 0, len(r.buf))
	if !r.full {
		return append(out, r.buf...)
	}
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// find returns the newest value for which match is true, nil when there is none. The pointer
// stays valid until the next push.
func (r *ring[T]) find(match func(*T) bool) *T {
	n := len(r.buf)
	for k := range n {
		i := n - 1 - k
		if r.full {
			i = (r.next + n - 1 - k) % n
		}
		if match(&r.buf[i]) {
			return &r.buf[i]
		}
	}
	return nil
}
