package ps

// SetBeforeApplyHook makes every asynchronous push run f just before it is applied (nil
// removes it).
func SetBeforeApplyHook(s *Server, f func()) {
	if f == nil {
		s.beforeApply.Store(nil)
		return
	}
	s.beforeApply.Store(&f)
}
