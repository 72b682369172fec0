package embedding

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
)

// OptimizerKind selects the update rule applied by Table.Apply.
type OptimizerKind uint8

const (
	// SGD: w -= lr*g. No state.
	SGD OptimizerKind = iota + 1
	// Adagrad (Duchi, Hazan, Singer 2011), per coordinate: a += g²; w -= lr*g/(sqrt(a)+eps).
	// State: one accumulator per coordinate.
	Adagrad
	// RowWiseAdagrad (as in DLRM/FBGEMM): one accumulator per row, a += mean(g²);
	// w -= lr*g/(sqrt(a)+eps). State: one float per row.
	RowWiseAdagrad
	// Adam (Kingma & Ba 2015) with bias correction and a per-row step count t:
	// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g²; w -= lr*(m/(1-b1^t)) / (sqrt(v/(1-b2^t))+eps).
	// State: m and v per coordinate and t per row.
	Adam
	// FTRL-Proximal (McMahan et al. 2013, Algorithm 1), per coordinate with L1 and L2 (lambda1
	// and lambda2; the other kinds apply Optimizer.L2 as weight decay, g += L2*w):
	// sigma = (sqrt(n+g²)-sqrt(n))/alpha; z += g - sigma*w; n += g²;
	// w = 0 if |z| <= l1 else -(z - sign(z)*l1) / ((beta+sqrt(n))/alpha + l2).
	// State: z and n per coordinate.
	FTRL
)

var optimizerNames = [...]string{SGD: "sgd", Adagrad: "adagrad", RowWiseAdagrad: "rowwise-adagrad", Adam: "adam", FTRL: "ftrl"}

func (k OptimizerKind) String() string {
	if int(k) < len(optimizerNames) && optimizerNames[k] != "" {
		return optimizerNames[k]
	}
	return fmt.Sprintf("optimizer(%d)", uint8(k))
}

// ParseOptimizer returns the kind named s ("sgd", "adagrad", "rowwise-adagrad", "adam", "ftrl").
func ParseOptimizer(s string) (OptimizerKind, error) {
	for k, n := range optimizerNames {
		if n != "" && n == s {
			return OptimizerKind(k), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown optimizer %q", ErrBadConfig, s)
}

// stateWidth is the number of 32-bit state words per row for dimension dim.
func (k OptimizerKind) stateWidth(dim int) int {
	switch k {
	case Adagrad:
		return dim
	case RowWiseAdagrad:
		return 1
	case Adam:
		return 2*dim + 1
	case FTRL:
		return 2 * dim
	}
	return 0
}

// Optimizer configures the update rule. Zero fields take the documented defaults.
type Optimizer struct {
	// Kind of update. Default Adagrad.
	Kind OptimizerKind
	// LearningRate (alpha for FTRL). Default 0.01. Larger learns faster and risks divergence.
	LearningRate float32
	// Eps is added to the denominator of Adagrad, row-wise Adagrad and Adam.
	// Default 1e-10 for the Adagrads, 1e-8 for Adam.
	Eps float32
	// InitialAccumulator is the starting value of the Adagrad accumulators. Default 0
	// (as in the paper and PyTorch; TensorFlow uses 0.1).
	InitialAccumulator float32
	// Beta1 and Beta2 are Adam's moment decay rates. Defaults 0.9 and 0.999.
	Beta1, Beta2 float32
	// Beta is FTRL's beta (smoothing of the per-coordinate rate). Default 1.
	Beta float32
	// L2 is the strength of L2 regularisation (the penalty L2/2*|w|² per row), applied as
	// weight decay, lazily: a row decays only at a step that updates it, so rows that are not
	// touched cost nothing and keep their weights. For SGD, Adagrad, row-wise Adagrad and Adam
	// the update rule sees the gradient g + L2*w (coupled, as PyTorch's weight_decay: the
	// adaptive rates scale the decay too); for FTRL it is lambda2 of the closed form. Default 0
	// (none). Typical values 1e-6 to 1e-3 per row update; larger shrinks rare ids' rows more,
	// since the decay acts once per update.
	L2 float32
	// L1 is FTRL's lambda1 (rows with |z| <= L1 are exactly 0: sparsity). Default 0. Only FTRL
	// has it: Validate refuses L1 with another kind.
	L1 float32
}

// InitKind selects how a new row's weights are drawn.
type InitKind uint8

const (
	// InitDefault is InitUniform, except for FTRL, whose rows start at zero as in the paper.
	InitDefault InitKind = iota
	// InitUniform draws from uniform(-Scale, +Scale).
	InitUniform
	// InitZeros sets every weight to 0.
	InitZeros
	// InitNormal draws from normal(0, Scale²).
	InitNormal
	// InitTruncatedNormal draws from normal(0, Scale²), redrawing values beyond 2*Scale
	// (TensorFlow's convention).
	InitTruncatedNormal
)

// Init configures row initialisation. A row's initial weights are a pure function of
// (Config.Seed, id, Init): the same id gives the same initial row in any process.
type Init struct {
	// Kind of distribution. Default InitDefault: uniform, or zeros for FTRL.
	Kind InitKind
	// Scale is the half-width (uniform) or standard deviation (normal). Default 1/sqrt(Dim).
	Scale float32
}

// AdmissionPolicy decides when an unseen id gets a row.
type AdmissionPolicy uint8

const (
	// AdmitAll creates a row on first use. The default.
	AdmitAll AdmissionPolicy = iota
	// AdmitCount creates a row once Lookup has seen the id MinCount times, counted in a
	// count-min sketch of bounded memory. Until then Lookup returns the initial value without
	// storing it, and Apply drops the id's gradient.
	AdmitCount
	// AdmitProbability creates a row at a Lookup of a missing id with probability Probability.
	// Apply drops gradients of ids without a row.
	AdmitProbability
)

// Admission configures admission of new ids.
type Admission struct {
	Policy AdmissionPolicy
	// MinCount is the number of sightings AdmitCount needs. Default 2.
	MinCount uint32
	// Probability is AdmitProbability's chance per sighting, in (0, 1]. Default 0.5.
	Probability float64
	// SketchWidth is the number of counters per row of the count-min sketch (rounded up to a power
	// of two). Default 1<<18. Memory is 4*SketchWidth*SketchDepth bytes; a wider sketch
	// over-counts less.
	SketchWidth int
	// SketchDepth is the number of hash rows of the sketch. Default 4.
	SketchDepth int
}

// EvictionPolicy chooses the victim when the row cap is reached.
type EvictionPolicy uint8

const (
	// LFU evicts the least frequently updated row among the sampled ones. The default.
	LFU EvictionPolicy = iota
	// LRU evicts the row updated longest ago among the sampled ones.
	LRU
)

// Eviction configures removal of rows.
type Eviction struct {
	// TTL in steps: EvictExpired(now) removes rows not touched for more than TTL steps.
	// Default 0 = no TTL.
	TTL uint32
	// MaxRows caps the row count; inserting beyond it evicts a victim from the inserting shard
	// first. An insert into a shard that holds no row evicts nothing, so a table with more
	// shards than MaxRows may briefly hold up to Shards rows more. Default 0 = no cap.
	MaxRows int
	// Policy chooses the victim. Default LFU.
	Policy EvictionPolicy
	// Sample is how many rows of the inserting shard are examined to pick a victim (Redis-style
	// sampled LFU/LRU; the choice is exact when the shard holds no more rows than Sample).
	// Default 8. Larger is closer to exact and slower.
	Sample int
}

// Config configures a Table. Dim is required; every other zero field takes its default.
type Config struct {
	// Name names the table in errors and logs. Optional.
	Name string
	// Dim is the number of float32 weights per row. Required, 1..65536.
	Dim int
	// Seed makes row initialisation deterministic per table.
	Seed uint64
	// Optimizer applied by Apply.
	Optimizer Optimizer
	// Init draws new rows.
	Init Init
	// Admission of new ids.
	Admission Admission
	// Eviction of rows.
	Eviction Eviction
	// Shards is the number of independently locked shards, a power of two in 1..65536.
	// Default 64. More shards mean less lock contention and more fixed memory.
	Shards int
	// Logger receives rare events (index growth is not logged). Nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns a Config for a table of dimension dim with Adagrad, uniform init and no
// admission or eviction.
func DefaultConfig(dim int) Config {
	return Config{Dim: dim, Optimizer: Optimizer{Kind: Adagrad}}
}

// MaxRowsPerShard is the most rows one shard holds.
const MaxRowsPerShard = 1<<24 - 2

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	o := &c.Optimizer
	if o.Kind == 0 {
		o.Kind = Adagrad
	}
	if o.LearningRate == 0 {
		o.LearningRate = 0.01
	}
	if o.Eps == 0 {
		o.Eps = 1e-10
		if o.Kind == Adam {
			o.Eps = 1e-8
		}
	}
	if o.Beta1 == 0 {
		o.Beta1 = 0.9
	}
	if o.Beta2 == 0 {
		o.Beta2 = 0.999
	}
	if o.Beta == 0 {
		o.Beta = 1
	}
	if c.Init.Kind == InitDefault {
		c.Init.Kind = InitUniform
		if o.Kind == FTRL {
			c.Init.Kind = InitZeros
		}
	}
	if c.Init.Scale == 0 && c.Dim > 0 {
		c.Init.Scale = float32(1 / math.Sqrt(float64(c.Dim)))
	}
	a := &c.Admission
	if a.MinCount == 0 {
		a.MinCount = 2
	}
	if a.Probability == 0 {
		a.Probability = 0.5
	}
	if a.SketchWidth == 0 {
		a.SketchWidth = 1 << 18
	}
	if a.SketchDepth == 0 {
		a.SketchDepth = 4
	}
	if c.Eviction.Sample == 0 {
		c.Eviction.Sample = 8
	}
	if c.Shards == 0 {
		c.Shards = 64
	}
	return c
}

// Validate reports every problem with c (after defaults are applied) in one error that wraps
// ErrBadConfig, or nil.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Dim < 1 || c.Dim > 1<<16 {
		bad("Dim %d not in 1..65536", c.Dim)
	}
	o := c.Optimizer
	if o.Kind < SGD || o.Kind > FTRL {
		bad("unknown optimizer kind %d", o.Kind)
	}
	finite := func(name string, v float32, lo, hi float64) {
		f := float64(v)
		if math.IsNaN(f) || f < lo || f > hi {
			bad("%s %v not in [%v, %v]", name, v, lo, hi)
		}
	}
	finite("Optimizer.LearningRate", o.LearningRate, 0, math.MaxFloat32)
	finite("Optimizer.Eps", o.Eps, 0, 1)
	finite("Optimizer.InitialAccumulator", o.InitialAccumulator, 0, math.MaxFloat32)
	finite("Optimizer.Beta1", o.Beta1, 0, 0.999999)
	finite("Optimizer.Beta2", o.Beta2, 0, 0.999999)
	finite("Optimizer.Beta", o.Beta, 0, math.MaxFloat32)
	finite("Optimizer.L1", o.L1, 0, math.MaxFloat32)
	if o.L1 != 0 && o.Kind != FTRL {
		bad("Optimizer.L1 %v: only ftrl has L1 (%s does not)", o.L1, o.Kind)
	}
	finite("Optimizer.L2", o.L2, 0, math.MaxFloat32)
	if c.Init.Kind > InitTruncatedNormal {
		bad("unknown init kind %d", c.Init.Kind)
	}
	finite("Init.Scale", c.Init.Scale, 0, math.MaxFloat32)
	a := c.Admission
	if a.Policy > AdmitProbability {
		bad("unknown admission policy %d", a.Policy)
	}
	if math.IsNaN(a.Probability) || a.Probability <= 0 || a.Probability > 1 {
		bad("Admission.Probability %v not in (0, 1]", a.Probability)
	}
	if a.SketchWidth < 1 || a.SketchWidth > 1<<30 {
		bad("Admission.SketchWidth %d not in 1..2^30", a.SketchWidth)
	}
	if a.SketchDepth < 1 || a.SketchDepth > 16 {
		bad("Admission.SketchDepth %d not in 1..16", a.SketchDepth)
	}
	e := c.Eviction
	if e.Policy > LRU {
		bad("unknown eviction policy %d", e.Policy)
	}
	if e.MaxRows < 0 {
		bad("Eviction.MaxRows %d is negative", e.MaxRows)
	}
	if e.TTL > math.MaxInt32 {
		bad("Eviction.TTL %d exceeds 2^31-1 steps", e.TTL)
	}
	if e.Sample < 1 || e.Sample > 1024 {
		bad("Eviction.Sample %d not in 1..1024", e.Sample)
	}
	if c.Shards < 1 || c.Shards > 1<<16 || c.Shards&(c.Shards-1) != 0 {
		bad("Shards %d is not a power of two in 1..65536", c.Shards)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}
