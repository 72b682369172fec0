package model

import (
	"errors"
	"fmt"
	"math"
)

// SynthConfig configures the synthetic Criteo-like data set. The zero value
// is the default: 13 dense features, 26 categorical fields with Criteo's
// cardinalities capped at 100 000, Zipf(1.05) ids, about 25 % positives.
type SynthConfig struct {
	// Seed selects the data set: the hidden model and every record are
	// pure functions of Seed (and of the record index).
	Seed uint64

	// DenseFeatures is the number of dense features. Default 13. Values are
	// log(1+count) of heavy-tailed counts, as usually fed to DLRM.
	DenseFeatures int

	// Vocab lists the number of distinct ids of each categorical field; its
	// length is the number of fields. nil means the default 26 fields. The
	// generator keeps (LatentDim+2)·4 + 8 bytes of hidden state per id
	// (32 B by default; 23 MB for the default 704 819 ids).
	Vocab []int

	// Hotness optionally lists, per field, the largest number of ids in one
	// sample (bag sizes are uniform in [1, Hotness[f]]; 1 = single-valued).
	// nil means every field is single-valued. Multi-valued fields enter the
	// hidden model mean-pooled.
	Hotness []int

	// ZipfExponent is s in P(rank k) ∝ 1/(k+1)^s. Default 1.05. Larger
	// values concentrate traffic on fewer ids (easier to learn).
	ZipfExponent float64

	// LatentDim is the width of the hidden per-id vectors whose pairwise
	// dot products drive the labels. Default 4.
	LatentDim int

	// Signal scales the hidden logit (before the base rate is set).
	// Default 1, which puts the Bayes-optimal AUC of the default data set
	// near 0.8; larger is easier.
	Signal float64

	// PositiveRate is the target fraction of positive labels, reached by
	// calibrating the hidden model's bias. Default 0.25.
	PositiveRate float64
}

// defaultVocab is Criteo Kaggle's per-field cardinality, capped at 100 000.
var defaultVocab = [...]int{
	1460, 583, 100000, 50000, 305, 24, 12517, 633, 3, 93145, 5683, 100000, 3194,
	27, 14992, 100000, 10, 5652, 2173, 4, 100000, 18, 15, 100000, 105, 14276,
}

// DefaultVocab returns the default per-field vocabulary sizes (Criteo Kaggle's, capped at
// 100 000), a fresh slice.
func DefaultVocab() []int { return append([]int(nil), defaultVocab[:]...) }

func (c SynthConfig) withDefaults() SynthConfig {
	if c.DenseFeatures == 0 {
		c.DenseFeatures = 13
	}
	if c.Vocab == nil {
		c.Vocab = defaultVocab[:]
	}
	c.Vocab = append([]int{}, c.Vocab...)
	if c.Hotness != nil {
		c.Hotness = append([]int{}, c.Hotness...)
	}
	if c.ZipfExponent == 0 {
		c.ZipfExponent = 1.05
	}
	if c.LatentDim == 0 {
		c.LatentDim = 4
	}
	if c.Signal == 0 {
		c.Signal = 1
	}
	if c.PositiveRate == 0 {
		c.PositiveRate = 0.25
	}
	return c
}

// maxVocabTotal caps the hidden state of the generator (about 32 B per id).
const maxVocabTotal = 1 << 25

// Validate reports every problem of c (after defaults) at once; each wraps
// ErrInvalidConfig.
func (c SynthConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.DenseFeatures < 1 || c.DenseFeatures > maxWidth {
		bad("DenseFeatures %d out of range [1, %d]", c.DenseFeatures, maxWidth)
	}
	if len(c.Vocab) < 1 || len(c.Vocab) > maxFields {
		bad("%d fields, want [1, %d]", len(c.Vocab), maxFields)
	}
	total := 0
	for f, v := range c.Vocab {
		if v < 1 || v > maxVocabTotal {
			bad("Vocab[%d] = %d out of range [1, %d]", f, v, maxVocabTotal)
			continue
		}
		total += v
	}
	if total > maxVocabTotal {
		bad("%d ids in all fields, more than %d", total, maxVocabTotal)
	}
	if c.Hotness != nil && len(c.Hotness) != len(c.Vocab) {
		bad("Hotness has %d entries, want one per field (%d)", len(c.Hotness), len(c.Vocab))
	}
	for f, h := range c.Hotness {
		if h < 1 || h > 1024 {
			bad("Hotness[%d] = %d out of range [1, 1024]", f, h)
		}
	}
	if !(c.ZipfExponent > 0 && c.ZipfExponent <= 10) {
		bad("ZipfExponent %v out of range (0, 10]", c.ZipfExponent)
	}
	if c.LatentDim < 1 || c.LatentDim > 256 {
		bad("LatentDim %d out of range [1, 256]", c.LatentDim)
	}
	if !(c.Signal > 0 && c.Signal <= 100) {
		bad("Signal %v out of range (0, 100]", c.Signal)
	}
	if !(c.PositiveRate > 0 && c.PositiveRate < 1) {
		bad("PositiveRate %v out of range (0, 1)", c.PositiveRate)
	}
	return errors.Join(errs...)
}

// Synth is a deterministic synthetic click data set with a known hidden
// model. Record i is a pure function of (Seed, i), so the set can be read
// in any order and sharded by index ranges; it is unbounded (any uint64
// index is a record). Labels are drawn as Bernoulli(p) with
// p = sigmoid(z(features)), so p — which Sample returns — is the true click
// probability, and ranking by it is Bayes-optimal: no model of the
// features can beat its AUC except by the luck of a finite test set.
//
// The hidden logit z is a bias plus
//   - a per-id weight of every field (first-order effects),
//   - the pairwise dot products of per-id latent vectors across all fields
//     (the interactions DLRM's dot-product layer is built for),
//   - a linear term in the dense features, and
//   - a nonlinear dense × categorical term: <tanh(A·x), Σ_f v_f>,
//
// with multi-valued fields mean-pooled. Ids are Zipf-distributed by rank and
// mapped to scattered 64-bit values, like hashed Criteo features; rare ids
// are seen too seldom to learn, which keeps a learned model below the
// ceiling.
//
// A Synth is immutable after NewSynth and safe for concurrent use.
type Synth struct {
	cfg     SynthConfig
	fields  int
	latent  int
	cdf     [][]float64 // per field: cumulative Zipf probabilities by rank
	guide   [][]int32   // per field: guide[j] = first rank with cdf ≥ j/len
	wOff    []int       // per field: offset of rank 0 in w (and /latent in v)
	w       []float32   // per id: first-order weight
	v       []float32   // per id: latent vector
	mu      []float64   // per dense feature: mean of the log-count normal
	center  []float64   // per dense feature: centering of log(1+count)
	lin     []float64   // dense linear weights
	proj    []float64   // latent×dense projection for the nonlinear term
	scale   [4]float64  // weights of the four logit terms
	bias    float64
	idSalt  uint64
	recSalt uint64
}

// Ceiling is the quality of the hidden model (the Bayes-optimal scores) on a
// range of records: what a perfect learner would reach there.
type Ceiling struct {
	// N is the number of records evaluated.
	N int
	// AUC of the true click probabilities against the drawn labels.
	AUC float64
	// LogLoss of the true click probabilities against the drawn labels.
	LogLoss float64
	// PositiveRate is the fraction of positive labels.
	PositiveRate float64
}

// NewSynth builds the hidden model of the data set described by cfg.
func NewSynth(cfg SynthConfig) (*Synth, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	g := &Synth{
		cfg:     cfg,
		fields:  len(cfg.Vocab),
		latent:  cfg.LatentDim,
		idSalt:  hash2(cfg.Seed, 0x696473), // "ids"
		recSalt: hash2(cfg.Seed, 0x726563), // "rec"
	}
	r := newRNG(cfg.Seed, 0x68696464656e) // "hidden"

	total := 0
	g.wOff = make([]int, g.fields)
	g.cdf = make([][]float64, g.fields)
	g.guide = make([][]int32, g.fields)
	for f, n := range cfg.Vocab {
		g.wOff[f] = total
		total += n
		cdf := make([]float64, n)
		var sum float64
		for k := range cdf {
			sum += math.Pow(float64(k+1), -cfg.ZipfExponent)
			cdf[k] = sum
		}
		for k := range cdf {
			cdf[k] /= sum
		}
		cdf[n-1] = 1
		g.cdf[f] = cdf
		guide := make([]int32, n)
		k := 0
		for j := range guide {
			for cdf[k] < float64(j)/float64(n) {
				k++
			}
			guide[j] = int32(k)
		}
		g.guide[f] = guide
	}
	g.w = make([]float32, total)
	g.v = make([]float32, total*g.latent)
	for i := range g.w {
		g.w[i] = float32(r.normal())
	}
	sv := 1 / math.Sqrt(float64(g.latent))
	for i := range g.v {
		g.v[i] = float32(sv * r.normal())
	}

	nd := cfg.DenseFeatures
	g.mu = make([]float64, nd)
	g.center = make([]float64, nd)
	g.lin = make([]float64, nd)
	g.proj = make([]float64, g.latent*nd)
	for j := range nd {
		g.mu[j] = 0.5 + 2.5*r.float64()
		// E[log(1+floor(e^N(mu,1)))] ≈ mu for the larger means; measure it
		// on a fixed draw so the features enter the hidden model centred.
		var s float64
		for range 256 {
			s += math.Log1p(math.Floor(math.Exp(g.mu[j] + r.normal())))
		}
		g.center[j] = s / 256
		g.lin[j] = r.normal() / math.Sqrt(float64(nd))
	}
	for i := range g.proj {
		g.proj[i] = 1.5 * r.normal() / math.Sqrt(float64(nd))
	}
	pairs := float64(g.fields * (g.fields - 1) / 2)
	g.scale = [4]float64{
		0.8 / math.Sqrt(float64(g.fields)),
		0.8 * math.Sqrt(float64(g.latent)) / math.Sqrt(max(pairs, 1)),
		0.5,
		0.6 * math.Sqrt(float64(g.latent)) / math.Sqrt(float64(g.fields)),
	}
	for i := range g.scale {
		g.scale[i] *= cfg.Signal
	}
	g.calibrate()
	return g, nil
}

// calibrate sets the bias so the mean true probability over a fixed set of
// calibration records is PositiveRate (bisection on a monotone function).
func (g *Synth) calibrate() {
	const n = 4096
	zs := make([]float64, n)
	var s Sample
	for i := range zs {
		var r rng
		zs[i] = g.draw(hash2(g.recSalt, 0xca11b)+uint64(i), &s, &r)
	}
	lo, hi := -30.0, 30.0
	for range 100 {
		mid := (lo + hi) / 2
		var mean float64
		for _, z := range zs {
			mean += sigmoid(z + mid)
		}
		if mean/n < g.cfg.PositiveRate {
			lo = mid
		} else {
			hi = mid
		}
	}
	g.bias = (lo + hi) / 2
}

// Config returns the generator's configuration with defaults filled in.
func (g *Synth) Config() SynthConfig { return g.cfg.withDefaults() }

// ModelConfig returns the default model Config sized for this data set
// (DenseFeatures and Fields set, everything else default).
func (g *Synth) ModelConfig() Config {
	return Config{DenseFeatures: g.cfg.DenseFeatures, Fields: g.fields}
}

// Sample writes record i into s, reusing s's slices, and returns the true
// click probability of the record (s.Label is drawn from it).
func (g *Synth) Sample(i uint64, s *Sample) float64 {
	var r rng
	z := g.draw(i, s, &r) + g.bias
	p := sigmoid(z)
	s.Label = 0
	if r.float64() < p {
		s.Label = 1
	}
	return p
}

// draw fills the features of record i into s and returns the hidden logit
// without the bias; r is left positioned for the label draw.
func (g *Synth) draw(i uint64, s *Sample, r *rng) float64 {
	*r = newRNG(g.recSalt, i)
	nd, l := g.cfg.DenseFeatures, g.latent

	if cap(s.Dense) < nd {
		s.Dense = make([]float32, nd)
	}
	s.Dense = s.Dense[:nd]
	var linear float64
	var h [256]float64
	hv := h[:l]
	for j := range nd {
		x := math.Log1p(math.Floor(math.Exp(g.mu[j] + r.normal())))
		s.Dense[j] = float32(x)
		xc := x - g.center[j]
		linear += g.lin[j] * xc
		for k := range hv {
			hv[k] += g.proj[k*nd+j] * xc
		}
	}
	for k := range hv {
		hv[k] = math.Tanh(hv[k])
	}

	s.IDs = s.IDs[:0]
	if cap(s.Offsets) < g.fields+1 {
		s.Offsets = make([]int32, g.fields+1)
	}
	s.Offsets = s.Offsets[:g.fields+1]
	s.Offsets[0] = 0

	// Pooled latent vectors of every field (for the pairwise term), and
	// their running sum (for the dense × categorical term).
	var pooledBuf [256]float64
	pooled := pooledBuf[:l] // the current field's pooled latent vector
	var sumV [256]float64
	sv := sumV[:l]
	var first, sq float64
	for f := range g.fields {
		bag := 1
		if g.cfg.Hotness != nil && g.cfg.Hotness[f] > 1 {
			bag = 1 + int(r.uint64()%uint64(g.cfg.Hotness[f]))
		}
		pv := pooled
		clear(pv)
		var w float64
		for range bag {
			k := g.zipf(f, r.float64())
			s.IDs = append(s.IDs, hash2(g.idSalt+uint64(f), uint64(k)))
			o := g.wOff[f] + k
			w += float64(g.w[o])
			vv := g.v[o*l : o*l+l]
			for c := range pv {
				pv[c] += float64(vv[c])
			}
		}
		inv := 1 / float64(bag)
		first += w * inv
		for c := range pv {
			pv[c] *= inv
			sv[c] += pv[c]
			sq += pv[c] * pv[c]
		}
		s.Offsets[f+1] = int32(len(s.IDs))
	}
	// Σ_{a<b} <v_a, v_b> = (|Σ_a v_a|² − Σ_a |v_a|²) / 2.
	var pair, cross float64
	for c := range sv {
		pair += sv[c] * sv[c]
		cross += hv[c] * sv[c]
	}
	pair = (pair - sq) / 2
	return g.scale[0]*first + g.scale[1]*pair + g.scale[2]*linear + g.scale[3]*cross
}

// zipf returns the rank whose cumulative probability interval holds u ∈
// [0, 1): the inverse CDF, started from the guide table so the expected
// number of steps is constant.
func (g *Synth) zipf(f int, u float64) int {
	cdf, guide := g.cdf[f], g.guide[f]
	k := int(guide[min(int(u*float64(len(guide))), len(guide)-1)])
	for k < len(cdf)-1 && cdf[k] <= u {
		k++
	}
	return k
}

// Ceiling evaluates the hidden model on records [from, to).
func (g *Synth) Ceiling(from, to uint64) (Ceiling, error) {
	if to <= from || to-from > 1<<26 {
		return Ceiling{}, fmt.Errorf("%w: record range [%d, %d) must hold 1 to %d records", ErrMetric, from, to, 1<<26)
	}
	n := int(to - from)
	labels := make([]float32, n)
	probs := make([]float64, n)
	var s Sample
	var pos int
	var ll float64
	for k := range n {
		p := g.Sample(from+uint64(k), &s)
		labels[k], probs[k] = s.Label, p
		p = math.Min(math.Max(p, 1e-15), 1-1e-15)
		if s.Label == 1 {
			pos++
			ll -= math.Log(p)
		} else {
			ll -= math.Log1p(-p)
		}
	}
	a, err := auc(labels, func(i int) float64 { return probs[i] }, n)
	if err != nil {
		return Ceiling{}, err
	}
	return Ceiling{N: n, AUC: a, LogLoss: ll / float64(n), PositiveRate: float64(pos) / float64(n)}, nil
}
