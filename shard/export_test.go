package shard

// SetWaitingHook makes every AwaitShard of d run f when it is about to block (nil removes it).
func SetWaitingHook(d *Dispatcher, f func()) {
	if f == nil {
		d.waiting.Store(nil)
		return
	}
	d.waiting.Store(&f)
}
