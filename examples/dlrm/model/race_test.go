//go:build race

package model_test

// raceEnabled skips the training test under the race detector, which slows
// this single-goroutine numeric code about fifteenfold and can find nothing
// in it.
const raceEnabled = true
