package elastic

import (
	"context"

	"github.com/elasticps/elasticps/ps"
)

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

// JobTable returns c's owner table, SetJobTable replaces it (on the coordinator alone), and
// PublishMove publishes t as a move's table.
func JobTable(c *Coordinator) *ps.OwnerTable       { return c.holder.Get() }
func SetJobTable(c *Coordinator, t *ps.OwnerTable) { c.holder.Set(t) }
func PublishMove(ctx context.Context, c *Coordinator, t *ps.OwnerTable) error {
	return c.publishMove(ctx, t)
}
