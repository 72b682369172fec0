package train

import (
	"errors"
	"sync"
)

// ErrPartialApply is returned (wrapped with the cause) by Run, RunWorker and RunCoordinator when
// a worker failed while applying a batch: a push or the batch's progress report failed, so the
// parameter servers may hold part of a batch the dispatcher did not count (or, for a report
// whose answer was lost, a batch it counted after all). No checkpoint is taken after that, as
// none could match the model with the data position; resume from the last committed one.
var ErrPartialApply = errors.New("train: a batch failed while being applied")

// gate separates applying batches (workers, shared) from taking a checkpoint (exclusive): a
// checkpoint closes the gate, which waits for the batches being applied and holds back new
// ones, so the snapshot sees every batch either wholly applied and reported or not at all.
//
// A worker whose apply fails breaks the gate before it leaves it: from then on the model may
// hold updates the dispatcher's count does not match, and whoever closes the gate to take a
// checkpoint finds it broken (broken) and must not take one. A broken gate stays broken.
type gate struct {
	mu sync.RWMutex

	causeMu sync.Mutex
	cause   error
}

func (g *gate) enter() { g.mu.RLock() }
func (g *gate) exit()  { g.mu.RUnlock() }
func (g *gate) close() { g.mu.Lock() }
func (g *gate) open()  { g.mu.Unlock() }

// fail breaks the gate. Call it inside the gate (between enter and exit), so that a checkpoint
// waiting to close the gate finds it broken.
func (g *gate) fail(err error) {
	g.causeMu.Lock()
	defer g.causeMu.Unlock()
	if g.cause == nil {
		g.cause = err
	}
}

// broken returns the first failure, or nil.
func (g *gate) broken() error {
	g.causeMu.Lock()
	defer g.causeMu.Unlock()
	return g.cause
}
