package model_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

func TestAUCHandComputed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels []float32
		scores []float32
		want   float64
	}{
		// 3 of the 4 positive/negative pairs are ordered correctly.
		{"classic", []float32{0, 0, 1, 1}, []float32{0.1, 0.4, 0.35, 0.8}, 0.75},
		{"perfect", []float32{0, 1, 0, 1}, []float32{0.1, 0.9, 0.2, 0.8}, 1},
		{"inverted", []float32{0, 1, 0, 1}, []float32{0.9, 0.1, 0.8, 0.2}, 0},
		{"all tied", []float32{0, 1, 0, 1, 1}, []float32{0.5, 0.5, 0.5, 0.5, 0.5}, 0.5},
		// Positives {0.9, 0.3, 0.5}, negatives {0.9, 0.1}: pairs score
		// 0.5 (tie) + 1, 0 + 1, 0 + 1 = 3.5 of 6.
		{"partial tie", []float32{1, 0, 1, 0, 1}, []float32{0.9, 0.9, 0.3, 0.1, 0.5}, 3.5 / 6},
		// Logits work as well as probabilities; ±Inf sorts fine.
		{"logits", []float32{1, 0, 0, 1}, []float32{float32(math.Inf(1)), -3, float32(math.Inf(-1)), 2}, 1},
	} {
		got, err := model.AUC(tc.labels, tc.scores)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: AUC %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAUCMatchesPairCount compares the sort-based AUC with the O(n²)
// definition on data with many ties.
func TestAUCMatchesPairCount(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 20 {
		n := 2 + r.IntN(300)
		labels := make([]float32, n)
		scores := make([]float32, n)
		for i := range n {
			labels[i] = float32(r.IntN(2))
			scores[i] = float32(r.IntN(1+trial)) / 4 // coarse: many ties
		}
		labels[0], labels[1] = 0, 1
		var num, pairs float64
		for i := range n {
			for j := range n {
				if labels[i] == 1 && labels[j] == 0 {
					pairs++
					switch {
					case scores[i] > scores[j]:
						num++
					case scores[i] == scores[j]:
						num += 0.5
					}
				}
			}
		}
		got, err := model.AUC(labels, scores)
		if err != nil {
			t.Fatal(err)
		}
		if want := num / pairs; math.Abs(got-want) > 1e-12 {
			t.Fatalf("trial %d (n=%d): AUC %v, pair count %v", trial, n, got, want)
		}
	}
}

func TestAUCErrors(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name           string
		labels, scores []float32
	}{
		{"empty", nil, nil},
		{"length", []float32{0, 1}, []float32{0.5}},
		{"one class", []float32{1, 1}, []float32{0.2, 0.4}},
		{"soft label", []float32{0, 0.5, 1}, []float32{0.1, 0.2, 0.3}},
		{"nan score", []float32{0, 1}, []float32{nan, 0.3}},
	} {
		if _, err := model.AUC(tc.labels, tc.scores); !errors.Is(err, model.ErrMetric) {
			t.Errorf("%s: err %v, want ErrMetric", tc.name, err)
		}
	}
}

func TestLogLossHandComputed(t *testing.T) {
	got, err := model.LogLoss([]float32{1, 0}, []float32{0.8, 0.3})
	if err != nil {
		t.Fatal(err)
	}
	if want := -(math.Log(0.8) + math.Log(0.7)) / 2; math.Abs(got-want) > 1e-7 {
		t.Errorf("LogLoss %v, want %v", got, want)
	}
	// A confident mistake is clamped, not infinite: -log(1e-7).
	got, err = model.LogLoss([]float32{1}, []float32{0})
	if err != nil {
		t.Fatal(err)
	}
	if want := -math.Log(1e-7); math.Abs(got-want) > 1e-6 {
		t.Errorf("clamped LogLoss %v, want %v", got, want)
	}

	for _, tc := range []struct {
		label, logit float32
		want         float64
	}{
		{1, 0, math.Ln2},
		{0, 0, math.Ln2},
		{0, 100, 100},            // log(1+e^100) without overflow
		{1, -100, 100},           // likewise
		{1, 100, math.Exp(-100)}, // tiny but not rounded to a wrong value
		{0.25, 2, math.Log1p(math.Exp(-2)) + 2*0.75},
	} {
		got, err := model.LogLossLogits([]float32{tc.label}, []float32{tc.logit})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got-tc.want) > 1e-12*math.Max(1, tc.want) {
			t.Errorf("LogLossLogits(y=%v, z=%v) = %v, want %v", tc.label, tc.logit, got, tc.want)
		}
	}

	// Both forms agree away from the clamp.
	labels := []float32{1, 0, 1, 0, 1}
	logits := []float32{-2, -1, 0, 1.5, 3}
	probs := make([]float32, len(logits))
	for i, z := range logits {
		probs[i] = float32(1 / (1 + math.Exp(-float64(z))))
	}
	a, err := model.LogLoss(labels, probs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := model.LogLossLogits(labels, logits)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(a-b) > 1e-6 {
		t.Errorf("LogLoss %v, LogLossLogits %v", a, b)
	}

	for _, bad := range [][2][]float32{
		{nil, nil},
		{{1}, {0.5, 0.5}},
		{{2}, {0.5}},
		{{1}, {1.5}},
	} {
		if _, err := model.LogLoss(bad[0], bad[1]); !errors.Is(err, model.ErrMetric) {
			t.Errorf("LogLoss(%v, %v): err %v, want ErrMetric", bad[0], bad[1], err)
		}
	}
	if _, err := model.LogLossLogits([]float32{1}, []float32{float32(math.NaN())}); !errors.Is(err, model.ErrMetric) {
		t.Errorf("LogLossLogits(NaN): err %v, want ErrMetric", err)
	}
}
