package model

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrMetric is returned (wrapped with the detail) by LogLoss, LogLossLogits
// and AUC when their input is unusable: lengths differ, no samples, a label
// outside the allowed set, a NaN score, or (AUC) only one class present.
var ErrMetric = errors.New("model: metric undefined for input")

// probClamp keeps log(p) finite for probabilities of exactly 0 or 1.
const probClamp = 1e-7

func checkPair(labels, scores []float32) error {
	if len(labels) != len(scores) {
		return fmt.Errorf("%w: %d labels, %d scores", ErrMetric, len(labels), len(scores))
	}
	if len(labels) == 0 {
		return fmt.Errorf("%w: no samples", ErrMetric)
	}
	return nil
}

// LogLoss returns the mean binary cross-entropy of probabilities probs
// against labels in [0, 1]; probabilities are clamped to [1e-7, 1-1e-7].
func LogLoss(labels, probs []float32) (float64, error) {
	if err := checkPair(labels, probs); err != nil {
		return 0, err
	}
	var sum float64
	for i, p := range probs {
		y := float64(labels[i])
		if !(y >= 0 && y <= 1) {
			return 0, fmt.Errorf("%w: label %d is %v", ErrMetric, i, labels[i])
		}
		if !(p >= 0 && p <= 1) {
			return 0, fmt.Errorf("%w: probability %d is %v", ErrMetric, i, p)
		}
		q := math.Min(math.Max(float64(p), probClamp), 1-probClamp)
		sum -= y*math.Log(q) + (1-y)*math.Log(1-q)
	}
	return sum / float64(len(probs)), nil
}

// LogLossLogits returns the mean binary cross-entropy of logits against
// labels in [0, 1], computed stably (no clamping needed).
func LogLossLogits(labels, logits []float32) (float64, error) {
	if err := checkPair(labels, logits); err != nil {
		return 0, err
	}
	var sum float64
	for i, z := range logits {
		y := float64(labels[i])
		if !(y >= 0 && y <= 1) {
			return 0, fmt.Errorf("%w: label %d is %v", ErrMetric, i, labels[i])
		}
		if math.IsNaN(float64(z)) {
			return 0, fmt.Errorf("%w: logit %d is NaN", ErrMetric, i)
		}
		sum += bceWithLogits(float64(z), y)
	}
	return sum / float64(len(logits)), nil
}

// AUC returns the exact area under the ROC curve of scores for binary labels
// (each exactly 0 or 1): the probability that a random positive scores
// higher than a random negative, ties counting one half. It sorts (O(n log
// n)); tied scores get their average rank (Mann–Whitney U). Scores may be
// probabilities, logits or any monotone transform of them. AUC allocates
// its sort buffer.
func AUC(labels, scores []float32) (float64, error) {
	return auc(labels, func(i int) float64 { return float64(scores[i]) }, len(scores))
}

// auc is AUC for n float64 scores given by score(i); labels must have n
// entries.
func auc(labels []float32, score func(i int) float64, n int) (float64, error) {
	if len(labels) != n {
		return 0, fmt.Errorf("%w: %d labels, %d scores", ErrMetric, len(labels), n)
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: no samples", ErrMetric)
	}
	type pair struct {
		s   float64
		pos bool
	}
	ps := make([]pair, n)
	var npos int
	for i := range n {
		y, s := labels[i], score(i)
		if y != 0 && y != 1 {
			return 0, fmt.Errorf("%w: label %d is %v, AUC needs 0 or 1", ErrMetric, i, y)
		}
		if math.IsNaN(s) {
			return 0, fmt.Errorf("%w: score %d is NaN", ErrMetric, i)
		}
		ps[i] = pair{s: s, pos: y == 1}
		if y == 1 {
			npos++
		}
	}
	nneg := n - npos
	if npos == 0 || nneg == 0 {
		return 0, fmt.Errorf("%w: %d positives and %d negatives, AUC needs both", ErrMetric, npos, nneg)
	}
	slices.SortFunc(ps, func(a, b pair) int {
		switch {
		case a.s < b.s:
			return -1
		case a.s > b.s:
			return 1
		}
		return 0
	})
	// Sum of the (1-based, tie-averaged) ranks of the positives.
	var rankSum float64
	for i := 0; i < n; {
		j := i
		var pos int
		for j < n && ps[j].s == ps[i].s {
			if ps[j].pos {
				pos++
			}
			j++
		}
		avg := float64(i+1+j) / 2 // mean of ranks i+1 .. j
		rankSum += avg * float64(pos)
		i = j
	}
	u := rankSum - float64(npos)*float64(npos+1)/2
	return u / (float64(npos) * float64(nneg)), nil
}
