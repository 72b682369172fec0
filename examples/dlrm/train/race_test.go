//go:build race

package train_test

// raceEnabled shrinks the training budgets under the race detector, which slows the numeric
// code about fifteenfold; the concurrency it checks (workers, gate, checkpoints) is the same.
const raceEnabled = true
