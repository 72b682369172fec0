package elastic

// SetBeforeDispatcherRestore makes f run in every rollback of c once its servers are restored,
// just before its dispatcher is (nil: nothing runs). f runs on the coordinator's executor: the
// recovery waits for it.
func SetBeforeDispatcherRestore(c *Coordinator, f func()) {
	if f == nil {
		c.beforeDispatcherRestore.Store(nil)
		return
	}
	c.beforeDispatcherRestore.Store(&f)
}
