package ps

import "context"

// SetBeforeApplyHook makes every asynchronous push run f just before it is applied (nil
// removes it).
func SetBeforeApplyHook(s *Server, f func()) {
	if f == nil {
		s.beforeApply.Store(nil)
		return
	}
	s.beforeApply.Store(&f)
}

// SetCountedHook makes s run f whenever the barrier of a synchronous push's table counts the
// push, before any later hold can begin (nil removes it).
func SetCountedHook(s *Server, f func(table string, worker, step uint32)) {
	if f == nil {
		s.counted.Store(nil)
		return
	}
	s.counted.Store(&f)
}

// SetAfterFenceHook makes every migration s receives run f just after it fenced the source
// (nil removes it).
func SetAfterFenceHook(s *Server, f func(ctx context.Context)) {
	if f == nil {
		s.mig.afterFence.Store(nil)
		return
	}
	s.mig.afterFence.Store(&f)
}

// SetAfterCopyHook makes every migration s receives run f at the end of its copy phase (nil
// removes it).
func SetAfterCopyHook(s *Server, f func(ctx context.Context)) {
	if f == nil {
		s.mig.afterCopy.Store(nil)
		return
	}
	s.mig.afterCopy.Store(&f)
}
