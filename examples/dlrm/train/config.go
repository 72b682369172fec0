package train

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// Config describes one training run of the embedded cluster. The zero value of every field but
// CheckpointDir means its default; Validate reports every problem at once.
type Config struct {
	// Data is what to train on. Default (zero value): the synthetic generator.
	Data DataSpec
	// Fields is the number of fields of libFM data (field indices 0 to Fields-1). Default: one
	// more than the highest field index in the first MiB of each data and test file.
	Fields int
	// FieldMap maps the feature indices of plain libSVM data to fields: entries NAME=LO-HI or
	// NAME=IDX separated by commas or newlines (shard.ParseFieldMap). Empty: every feature in one
	// field, which the summary points out (one pooled vector: a logistic regression in effect).
	FieldMap string
	// Pooling pools the several features of one field of libSVM or libFM data (their rows
	// weighted by their values): "sum" or "mean". Default "sum", except "mean" for libSVM data
	// without a FieldMap.
	Pooling string
	// BadLines is what a malformed line of text data does: SkipBadLines (the default) counts it
	// per file and goes on, within MaxBadFraction; FailOnBadLine stops the run at the first, with
	// its file and line.
	BadLines BadLinePolicy
	// MaxBadFraction stops the run when more than this share of a file's lines is malformed, or
	// when the first 1000 lines read of a file all are. Default 0.01 (1 %); 1 never stops.
	MaxBadFraction float64
	// TestFiles optionally names held-out files of the same format as Data (Criteo, LibSVM or
	// LibFM), or for MovieLens one directory with its own ratings file (or one ratings file, such
	// as the 100K layout's u1.test), joined with the training directory's movies.
	// Without them the held-out set is a seeded random TestFraction of the data.
	TestFiles []string
	// AllowOverlap lets a run train and report its test figure when test records given apart
	// from the training data (TestFiles) are also in it, identical after parsing: the summary
	// then gives their count (Summary.Overlap). Without it such a run is refused before
	// training with an *OverlapError naming the count and the first few file:line pairs. The
	// check (Overlap) costs one parsing pass over the training data before training, and
	// memory for the test records only. A seeded random split is never refused: the records
	// it puts on both sides are the data's duplicates, which the summary counts.
	AllowOverlap bool
	// TestFraction is the share of records held out for evaluation when there are no TestFiles.
	// Default 0.2.
	TestFraction float64
	// ValidFraction carves a validation set out of the training data: this share of the
	// records left for training (after the held-out test records) is not trained, and the
	// evaluations during training (EvalEvery) and those of keep-best and early stopping score
	// it instead of the test set, so that choosing a commit, a stopping point or settings by
	// them never looks at the test set; the summary reports both. MovieLens and text data: a
	// seeded random share of the ratings or lines; synthetic data: as many generated records
	// of their own range (at most TestRecords). Default 0: no validation set, every evaluation
	// scores the test set.
	ValidFraction float64
	// TestRecords caps the held-out set evaluated (exactly, every record) each time. Default
	// 20 000 for synthetic data (a range far from the training records) and 1 000 000 for
	// files, where the first TestRecords held-out records are evaluated and later held-out
	// records are neither trained nor evaluated. Larger gives steadier figures and slower
	// evaluations.
	TestRecords int
	// Synth shapes the synthetic data (fields, vocabularies, skew); its Seed is replaced by Seed.
	// The zero value is model.SynthConfig's default: 13 dense features and 26 Criteo-like fields.
	Synth model.SynthConfig
	// TrainRecords is the size of the synthetic training set (record indices 0..TrainRecords-1).
	// Default 2 000 000. Ignored for files.
	TrainRecords int64
	// Seed seeds the synthetic data, the held-out split, the model's initial weights and the
	// shuffles. Default 0 (a valid seed).
	Seed uint64

	// EmbeddingDim is the width of every embedding row and of the bottom MLP's output. Default
	// 16, and 32 for MovieLens (DefaultMovieLensDim).
	EmbeddingDim int
	// BottomHidden and TopHidden are the hidden layer widths of the two MLPs (see
	// model.Config); nil means the model's defaults {64, 32} and {128, 64}.
	BottomHidden, TopHidden []int
	// EmbeddingOptimizer is applied to embedding rows on the parameter servers, EmbeddingInit
	// is the half-width of the uniform distribution new rows are drawn from, and DenseOptimizer
	// is applied to the MLP weights on the parameter servers. Zero fields take defaults tuned
	// per data kind: for MovieLens, whose 80 000 training ratings a fast learner overfits within
	// two epochs, Adam at 0.005 from rows of ±0.03 and Adagrad at 0.005 on the MLP; otherwise
	// (the Criteo-like data) Adagrad at 0.05 from rows of ±0.1 and Adagrad at 0.02 on the MLP.
	//
	// Their L2 fields are weight decay, applied on the servers as each row or MLP tensor is
	// updated (embedding.Optimizer.L2: the rule sees g + L2*w; an embedding row decays only at
	// the steps that touch it). 0 takes the default per data kind (DefaultL2), a negative value
	// means none.
	EmbeddingOptimizer embedding.Optimizer
	EmbeddingInit      float32
	DenseOptimizer     embedding.Optimizer
	// FirstOrder gives every id of every sparse field a learned scalar beside its embedding row
	// (a table of dimension 1 per field on the servers, rows starting at 0, trained with
	// EmbeddingOptimizer), pooled like the row and added to the logit (model.Config.FirstOrder):
	// the first-order terms of a factorisation machine. Default (zero value) off: measured level
	// within noise on MovieLens (mean validation AUC 0.8061 with and without, three seeds) and
	// on the synthetic data (0.7162 against 0.7153 and 0.6822 against 0.6822 on two seeds).
	FirstOrder Switch
	// ConcatEmbeddings puts the pooled embedding vectors into the top MLP's input beside the
	// bottom output and the dot products (model.Config.ConcatEmbeddings). Default (zero value)
	// on for MovieLens, where it measured a small gain on every seed but one of six (mean
	// validation AUC 0.8084 against 0.8061 on seeds 1-3, 0.8029 against 0.8014 on seeds 4-6),
	// off elsewhere (the DLRM reference's dot interaction).
	ConcatEmbeddings Switch
	// MinCount is a frequency threshold on the ids of MovieLens data: an id seen fewer than
	// MinCount times among the training ratings (in its field) shares one row with every other
	// such id of the field, in training and evaluation alike (as Criteo's ids are thresholded
	// for DLRM), so ids too rare to learn do not each get a vector fitted to a few labels and
	// unseen ids meet a trained row. Default 10 for MovieLens (DefaultMovieLensMinCount); 1
	// means none. Other data kinds are streamed, not counted beforehand: they take only 1.
	MinCount int
	// UserDay adds a field to MovieLens records: the user and the UTC day of the rating, the
	// session a rating belongs to (a user's ratings of one day share a mood and a purpose, as
	// in Koren's day-specific user biases). With a random split most held-out ratings share a
	// day with trained ones; a day never trained is a rare id (MinCount). Default (zero value)
	// on for MovieLens; other data kinds take only the default.
	UserDay Switch
	// BatchSize is the number of records per worker step. Default 256.
	BatchSize int

	// Epochs is the number of passes over the training data. Default 3 for MovieLens (where
	// the held-out AUC peaks), 1 otherwise. Duration may end the run first.
	Epochs int
	// Duration ends training after this much wall time (a final checkpoint follows); the
	// summary then says how far the epochs got ("stopped by -duration after N of M samples").
	// 0 means run until the epochs are done (the command's default for file data; a minute for
	// synthetic data).
	Duration time.Duration
	// Servers is the number of parameter servers. Default 2.
	Servers int
	// ScaleAt changes the cluster while it trains: at each step's time after the start, the
	// coordinator is asked for its servers and workers (SetParallelism); a new server count
	// moves the slots live. Steps in time order.
	ScaleAt []ScaleStep
	// Workers is the number of workers. Default 2.
	Workers int
	// Slots is the job's slot count. Default 4096.
	Slots int
	// ShardSize is the number of records per data shard. Default 8192 for synthetic data, 4096
	// for files (whose shards are cut by lines).
	ShardSize int64

	// CheckpointDir is where checkpoints are persisted. Required.
	CheckpointDir string
	// CheckpointEvery takes a flash checkpoint every this many training steps (over all
	// workers). Default 1000; negative: none by steps.
	CheckpointEvery int
	// CheckpointInterval takes a flash checkpoint after this much training time (pauses at
	// barriers do not count) when CheckpointEvery steps have not come first, so that a slow run
	// checkpoints too: at the default 1000 steps, one of 256 records per worker step slower than
	// about 4,300 samples/s would take none in its first minute but the last. Default 10s (the
	// main command's first checkpoint within about ten seconds whatever its speed; a pause of a
	// memory copy every ten seconds costs training little); negative: none by time. With neither
	// schedule, only the final checkpoint is taken (unless NoFinalCheckpoint).
	CheckpointInterval time.Duration
	// NoFinalCheckpoint skips the checkpoint at the end of the run: the run then behaves like a
	// process that died after its last periodic checkpoint.
	NoFinalCheckpoint bool
	// FullEvery makes every FullEvery-th checkpoint full and the others deltas. Default 5.
	FullEvery int
	// Resume restores the newest committed checkpoint of CheckpointDir before training.
	Resume bool
	// Evaluate, instead of training, loads one commit of CheckpointDir into fresh servers and
	// evaluates it on the test set (and the validation set, with ValidFraction): "best", the
	// commit a KeepBest run marked best (retention keeps it), "newest", or the step of a commit.
	// The data and model settings must be those of the run that wrote it. Nothing is trained,
	// and no checkpoint is written or deleted. Default "": train.
	Evaluate string
	// Overwrite lets a run without Resume start in a CheckpointDir that holds the commits of an
	// earlier run of the job, and deletes them; without it such a run fails with
	// ErrCheckpointsExist and deletes nothing. Only a coordinator (Run, RunCoordinator) ever
	// deletes commits, and one that finds its servers running the job takes it over instead.
	Overwrite bool
	// ShmDir holds the shared-memory tier of the checkpoints. Default: a directory named after
	// CheckpointDir under /dev/shm when /dev/shm has 1 GiB free, else under the temporary
	// directory. The directory used is recorded in CheckpointDir, and a resume without ShmDir
	// uses the recorded one; the directory records CheckpointDir in turn. A copy of
	// CheckpointDir carries the original's record, and a run in the copy neither uses nor
	// deletes the original's regions; a ShmDir whose regions belong to another checkpoint
	// directory is refused (ErrConfig). A directory a run made is removed with the last region.
	ShmDir string
	// KeepShm leaves the shared-memory regions in place at the end, so that a resume on this
	// host restores from memory. Default false: they are deleted (the storage copy stays).
	// Regions of servers the run does not have are deleted either way once it has committed.
	KeepShm bool
	// StatusAddr, if set, is the address (HOST:PORT) the coordinator serves its live status
	// page on (package statuspage), with its JSON at /status; a Note event gives its URL.
	// Off loopback the page asks for the token of the cluster secret.
	StatusAddr string
	// MetricsAddr, if set, is the address (HOST:PORT) each process serves its Prometheus
	// metrics on, at /metrics (package metrics): the embedded run all of its parts', a role
	// its own. A Note event gives the URL.
	MetricsAddr string
	// Recovery is what the job does when a parameter server fails: elastic.Rollback (the
	// default: every server returns to the newest commit) or elastic.Partial (only the failed
	// server's slots do; the updates to them since the commit are lost and counted).
	Recovery elastic.RecoveryPolicy

	// EvalEvery evaluates the held-out set this often while training. Default 15s; negative
	// evaluates only at the end.
	EvalEvery time.Duration
	// KeepBest evaluates the held-out set (the validation set, with ValidFraction) at every
	// checkpoint, while training is paused for its snapshot, and stores the evaluation in the
	// commit's job state with the best evaluated commit so far (by BestMetric), so that each figure is
	// that of exactly the parameters the commit holds, a resume knows which commit was best, and
	// the summary reports the best beside the final. The best commit is pinned in the
	// checkpoint directory (checkpoint.Committer.Pin): retention keeps it, and only it, beyond
	// its usual commits, and Evaluate "best" loads it. At the end of the run the best commit,
	// unless it is the final model, is loaded into fresh servers and scored on the test set
	// (Summary.BestTest): the summary's test line reports it beside the final model. The evaluation adds to each checkpoint's
	// pause (about 0.15 s for MovieLens' 20 000 held-out ratings; TestRecords bounds it), and
	// each EvalEvery tick takes a checkpoint instead of evaluating the live servers. Embedded
	// mode only (Run). Default (zero value): on with a validation set (ValidFraction) or an
	// EarlyStop, else off, since choosing a commit by the test set would leak the test set
	// into the figure reported for it; SwitchOn keeps the best by the test set all the same.
	KeepBest Switch
	// Predictions, if set, names a file the final test evaluation is written to, one line per
	// test record after a header line: where the record is from, its label and the model's
	// score (the probability of a click), tab-separated, in the test set's order (Summary's
	// Predictions says more). The model is the one the summary's test line reports
	// (Summary.Test): with KeepBest the best commit, else the final model of a training run,
	// and the loaded commit with Evaluate. Written to a temporary file renamed into place: it
	// is never seen half written. Embedded mode only (Run). Default "": none.
	Predictions string
	// EarlyStop stops training after this many evaluated commits in a row without a better
	// figure (BestMetric) than the best (a final checkpoint follows): the patience, in
	// evaluations. Default (0): DefaultEarlyStop when KeepBest is on with a validation set
	// (ValidFraction), else never; negative: never. A positive EarlyStop turns KeepBest on
	// unless it is SwitchOff, which is refused.
	EarlyStop int
	// BestMetric is the held-out figure KeepBest and EarlyStop choose by: MetricLogLoss (the
	// default: lower is better) or MetricAUC (higher is better). Log loss punishes the
	// over-confidence of a model trained too long, which AUC, a ranking figure, does not see: a
	// model can keep its ranking while its probabilities drift far from the base rate.
	BestMetric Metric
	// ProgressEvery emits a Progress event this often. Default 500ms.
	ProgressEvery time.Duration
	// LeaseTTL is the data-shard lease lifetime. Default 30s.
	LeaseTTL time.Duration

	// Logger receives the components' warnings. Nil discards.
	Logger *slog.Logger
	// OnEvent, if set, receives progress, evaluations and checkpoints as they happen, from the
	// run's coordinating goroutines (one call at a time). It must not block for long.
	OnEvent func(Event)
}

// BadLinePolicy says what a malformed line of text data does (Config.BadLines).
type BadLinePolicy uint8

const (
	// SkipBadLines counts the line, reports it in the summary and goes on, unless a file has more
	// than Config.MaxBadFraction of bad lines or its first 1000 lines read are all bad.
	SkipBadLines BadLinePolicy = iota
	// FailOnBadLine stops the run at the first malformed line, naming its file and line.
	FailOnBadLine
)

// ParseBadLinePolicy reads "skip" or "fail".
func ParseBadLinePolicy(s string) (BadLinePolicy, error) {
	switch s {
	case "skip":
		return SkipBadLines, nil
	case "fail":
		return FailOnBadLine, nil
	}
	return 0, fmt.Errorf("bad-line policy %q: want skip or fail", s)
}

// CommandDefaults returns the Config the dlrm command trains with when given no flags (its
// flags' defaults), CheckpointDir aside: synthetic data with Zipf exponent 1.2 and each field's
// vocabulary capped at 20,000 ids, MLPs of hidden widths 64,32 and 128,64, a minute of training
// with seed 1. Benchmarks of "the main command" start from it.
func CommandDefaults() Config {
	vocab := model.DefaultVocab()
	for i, v := range vocab {
		vocab[i] = min(v, 20_000)
	}
	return Config{
		Synth: model.SynthConfig{ZipfExponent: 1.2, Vocab: vocab}, TrainRecords: DefaultTrainRecords,
		TestFraction: DefaultTestFraction, MaxBadFraction: DefaultMaxBadFraction, Seed: 1,
		BottomHidden: []int{64, 32}, TopHidden: []int{128, 64}, BatchSize: DefaultBatchSize,
		Duration: time.Minute, Servers: DefaultServers, Workers: DefaultWorkers,
		CheckpointEvery: DefaultCheckpointEvery, CheckpointInterval: DefaultCheckpointInterval,
		FullEvery: DefaultFullEvery, EvalEvery: DefaultEvalEvery,
		StatusAddr: "127.0.0.1:0", // the status page on loopback, on a port of its own
	}
}

// Defaults of Config.
const (
	DefaultTrainRecords = 2_000_000
	DefaultSynthTest    = 20_000
	DefaultFileTest     = 1_000_000
	DefaultTestFraction = 0.2
	DefaultEmbeddingDim = 16
	// DefaultMovieLensDim is MovieLens' embedding width, chosen on a validation split carved
	// from the training ratings (Config.ValidFraction 0.1, three seeds, the test split never
	// scored): mean validation AUC 0.7969 at 32 against 0.7942 at 16 and 0.7955 at 64 (three
	// epochs, the other defaults); 2 or 4 epochs, embedding learning rates 0.002-0.003,
	// embedding L2 3e-4 and 1e-3, MLP learning rates 0.002 and 0.01 and batches of 128 or 512
	// did not do better beyond noise (0.7973 at best; two asynchronous workers move a seed's
	// figure by about 0.003 from run to run).
	DefaultMovieLensDim = 32
	// DefaultMovieLensMinCount is MovieLens' frequency threshold (Config.MinCount), chosen the
	// same way once the user_day field was in: mean validation AUC 0.8078 at 7, 0.8061 at 10,
	// 0.8061 at 14 (level within noise: the middle of the plateau), 0.8049 at 5, 0.7995 at 20;
	// without the threshold 0.8004, and without user_day 0.8021. With both, width 16 measured
	// level with 32 (0.8067 against 0.8068), two and four epochs lower (0.8050, 0.8012),
	// embedding L2 none, 3e-4 and learning rate 0.003 level (0.8066, 0.8052, 0.8075).
	DefaultMovieLensMinCount  = 10
	DefaultBatchSize          = 256
	DefaultServers            = 2
	DefaultWorkers            = 2
	DefaultCheckpointEvery    = 1000
	DefaultCheckpointInterval = 10 * time.Second
	DefaultFullEvery          = 5
	DefaultEvalEvery          = 15 * time.Second
	// DefaultEarlyStop is the patience of early stopping with a validation set (Config.EarlyStop):
	// three evaluations in a row without a better figure.
	DefaultEarlyStop      = 3
	DefaultProgressEvery  = 500 * time.Millisecond
	DefaultLeaseTTL       = 30 * time.Second
	DefaultMaxBadFraction = 0.01
)

// DefaultL2 is the weight decay Config takes for data of kind k when its L2 is 0: on the
// embedding rows, or with dense on the MLP.
// MovieLens rows take 1e-4 (measured over three seeds of the latest-small split: 1e-5 and 1e-4
// are level with none, within 0.001 AUC, 1e-3 loses 0.008, 1e-2 loses 0.017; the MLP is best
// without: 1e-4 to 1e-2 lose 0.0005 to 0.007); other data take none, not measured yet.
func DefaultL2(k DataKind, dense bool) float32 {
	if k == MovieLens && !dense {
		return 1e-4
	}
	return 0
}

// Switch is a setting that is on, off, or (the zero value) its default.
type Switch int8

const (
	SwitchDefault Switch = iota // the setting's default
	SwitchOn                    // on
	SwitchOff                   // off
)

// firstOrder says whether the model has first-order terms (defaults filled in).
func (c *Config) firstOrder() bool { return c.FirstOrder == SwitchOn }

// embeddingOptimizer and denseOptimizer are the optimizers the servers run: a negative L2 (none)
// is 0.
func (c *Config) embeddingOptimizer() embedding.Optimizer {
	o := c.EmbeddingOptimizer
	o.L2 = max(o.L2, 0)
	return o
}

func (c *Config) denseOptimizer() embedding.Optimizer {
	o := c.DenseOptimizer
	o.L2 = max(o.L2, 0)
	return o
}

// ErrConfig is returned (joined with every problem) by Config.Validate and Run.
var ErrConfig = errors.New("train: invalid config")

func (c *Config) fill() {
	if c.TestFraction == 0 {
		c.TestFraction = DefaultTestFraction
	}
	if c.TestRecords == 0 {
		c.TestRecords = DefaultFileTest
		if c.Data.Kind == Synthetic {
			c.TestRecords = DefaultSynthTest
		}
	}
	if c.TrainRecords == 0 {
		c.TrainRecords = DefaultTrainRecords
	}
	if c.EmbeddingDim == 0 {
		c.EmbeddingDim = DefaultEmbeddingDim
		if c.Data.Kind == MovieLens {
			c.EmbeddingDim = DefaultMovieLensDim
		}
	}
	ek, elr, einit, dk, dlr := embedding.Adagrad, float32(0.05), float32(0.1), embedding.Adagrad, float32(0.02)
	if c.Data.Kind == MovieLens {
		ek, elr, einit, dk, dlr = embedding.Adam, 0.005, 0.03, embedding.Adagrad, 0.005
	}
	if c.EmbeddingOptimizer.Kind == 0 {
		c.EmbeddingOptimizer.Kind = ek
	}
	if c.EmbeddingOptimizer.LearningRate == 0 {
		c.EmbeddingOptimizer.LearningRate = elr
	}
	if c.EmbeddingInit == 0 {
		c.EmbeddingInit = einit
	}
	if c.DenseOptimizer.Kind == 0 {
		c.DenseOptimizer.Kind = dk
	}
	if c.DenseOptimizer.LearningRate == 0 {
		c.DenseOptimizer.LearningRate = dlr
	}
	if c.EmbeddingOptimizer.L2 == 0 {
		c.EmbeddingOptimizer.L2 = DefaultL2(c.Data.Kind, false)
	}
	if c.DenseOptimizer.L2 == 0 {
		c.DenseOptimizer.L2 = DefaultL2(c.Data.Kind, true)
	}
	if c.FirstOrder == SwitchDefault {
		c.FirstOrder = SwitchOff
	}
	if c.MinCount == 0 {
		c.MinCount = 1
		if c.Data.Kind == MovieLens {
			c.MinCount = DefaultMovieLensMinCount
		}
	}
	if c.ConcatEmbeddings == SwitchDefault {
		c.ConcatEmbeddings = SwitchOff
		if c.Data.Kind == MovieLens {
			c.ConcatEmbeddings = SwitchOn
		}
	}
	if c.UserDay == SwitchDefault {
		c.UserDay = SwitchOff
		if c.Data.Kind == MovieLens {
			c.UserDay = SwitchOn
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Epochs == 0 {
		c.Epochs = 1
		if c.Data.Kind == MovieLens {
			c.Epochs = 3
		}
	}
	if c.Servers == 0 {
		c.Servers = DefaultServers
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Slots == 0 {
		c.Slots = ps.DefaultSlots
	}
	if c.ShardSize == 0 {
		c.ShardSize = 8192
		if c.Data.Kind != Synthetic {
			c.ShardSize = 4096
		}
	}
	if c.CheckpointEvery == 0 {
		c.CheckpointEvery = DefaultCheckpointEvery
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.FullEvery == 0 {
		c.FullEvery = DefaultFullEvery
	}
	if c.EvalEvery == 0 {
		c.EvalEvery = DefaultEvalEvery
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = DefaultProgressEvery
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.MaxBadFraction == 0 {
		c.MaxBadFraction = DefaultMaxBadFraction
	}
}

// resolveBest settles, for an embedded run (Run), KeepBest to SwitchOn or SwitchOff and
// EarlyStop to the patience or -1 (never), from their defaults.
func (c *Config) resolveBest() {
	keep := c.KeepBest == SwitchOn || c.KeepBest == SwitchDefault && (c.ValidFraction > 0 || c.EarlyStop > 0)
	switch {
	case !keep:
		c.KeepBest, c.EarlyStop = SwitchOff, -1
	case c.EarlyStop == 0 && c.ValidFraction > 0:
		c.KeepBest, c.EarlyStop = SwitchOn, DefaultEarlyStop
	case c.EarlyStop == 0:
		c.KeepBest, c.EarlyStop = SwitchOn, -1
	default:
		c.KeepBest = SwitchOn
	}
}

// keepBest says whether the run keeps the best commit (after resolveBest).
func (c *Config) keepBest() bool { return c.KeepBest == SwitchOn }

// Validate reports every problem of c (after defaults are applied) at once, joined with
// ErrConfig.
func (c Config) Validate() error {
	c.fill()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for i, st := range c.ScaleAt {
		if st.At <= 0 || (i > 0 && st.At <= c.ScaleAt[i-1].At) {
			bad("scale step %d at %v: times must be positive and increasing", i+1, st.At)
		}
		if st.Servers < 0 || st.Workers < 0 || st.Servers == 0 && st.Workers == 0 {
			bad("scale step %d asks for %d servers and %d workers", i+1, st.Servers, st.Workers)
		}
	}
	if c.Data.Kind > LibFM {
		bad("unknown data kind %d", c.Data.Kind)
	}
	text := c.Data.Kind == Criteo || c.Data.Kind == LibSVM || c.Data.Kind == LibFM
	if c.Fields != 0 && (c.Data.Kind != LibFM || c.Fields < 0 || c.Fields > shard.MaxFields) {
		bad("Fields %d: a field count of libfm data, at most %d", c.Fields, shard.MaxFields)
	}
	if c.FieldMap != "" {
		if c.Data.Kind != LibSVM {
			bad("a field map is for libsvm data (libfm lines name their fields)")
		} else if _, err := shard.ParseFieldMap(c.FieldMap); err != nil {
			bad("field map: %w", err)
		}
	}
	switch {
	case c.Pooling != "" && c.Data.Kind != LibSVM && c.Data.Kind != LibFM:
		bad("Pooling %q is for libsvm and libfm data", c.Pooling)
	case c.Pooling != "" && c.Pooling != "sum" && c.Pooling != "mean":
		bad("Pooling %q: want sum or mean", c.Pooling)
	}
	if c.BadLines > FailOnBadLine {
		bad("unknown bad-line policy %d", c.BadLines)
	}
	if c.MaxBadFraction < 0 || c.MaxBadFraction > 1 || c.MaxBadFraction != c.MaxBadFraction {
		bad("MaxBadFraction %v outside [0, 1]", c.MaxBadFraction)
	}
	if c.Data.Kind == Synthetic && len(c.Data.Paths) > 0 {
		bad("synthetic data takes no paths")
	}
	if c.Data.Kind != Synthetic && len(c.Data.Paths) == 0 {
		bad("%s data needs at least one path", c.Data.Kind)
	}
	switch {
	case len(c.TestFiles) > 1 && c.Data.Kind == MovieLens:
		bad("movielens takes one held-out path (a directory or a ratings file), got %d", len(c.TestFiles))
	case len(c.TestFiles) > 0 && !text && c.Data.Kind != MovieLens:
		bad("held-out test files work with criteo, libsvm, libfm and movielens data; %s is split by the test fraction", c.Data.Kind)
	}
	if c.TestFraction <= 0 || c.TestFraction >= 1 {
		bad("TestFraction %v outside (0, 1)", c.TestFraction)
	}
	if c.ValidFraction < 0 || c.ValidFraction >= 1 || c.ValidFraction != c.ValidFraction {
		bad("ValidFraction %v outside [0, 1)", c.ValidFraction)
	}
	if c.TestRecords < 2 {
		bad("TestRecords %d: need at least 2 held-out records", c.TestRecords)
	}
	if c.Data.Kind == Synthetic {
		sc := c.Synth
		sc.Seed = c.Seed
		if err := sc.Validate(); err != nil {
			bad("synthetic data: %w", err)
		}
	}
	if c.TrainRecords < 1 {
		bad("TrainRecords %d must be positive", c.TrainRecords)
	}
	if c.EmbeddingDim < 1 || c.EmbeddingDim > 1024 {
		bad("EmbeddingDim %d outside [1, 1024]", c.EmbeddingDim)
	}
	for _, h := range append(append([]int(nil), c.BottomHidden...), c.TopHidden...) {
		if h < 1 || h > 1<<14 {
			bad("hidden layer width %d outside [1, %d]", h, 1<<14)
		}
	}
	for name, o := range map[string]embedding.Optimizer{"embedding": c.EmbeddingOptimizer, "dense": c.DenseOptimizer} {
		if o.LearningRate <= 0 || o.LearningRate > 100 {
			bad("%s learning rate %v outside (0, 100]", name, o.LearningRate)
		}
		if o.Kind < embedding.SGD || o.Kind > embedding.FTRL {
			bad("%s optimizer kind %d unknown", name, o.Kind)
		}
		if o.L2 != o.L2 || o.L2 > 10 {
			bad("%s L2 %v above 10", name, o.L2)
		}
	}
	if c.EmbeddingInit < 0 || c.EmbeddingInit > 10 {
		bad("EmbeddingInit %v outside [0, 10]", c.EmbeddingInit)
	}
	if c.FirstOrder > SwitchOff {
		bad("unknown FirstOrder %d", c.FirstOrder)
	}
	if c.ConcatEmbeddings > SwitchOff {
		bad("unknown ConcatEmbeddings %d", c.ConcatEmbeddings)
	}
	if c.UserDay > SwitchOff {
		bad("unknown UserDay %d", c.UserDay)
	}
	if c.MinCount < 1 || c.MinCount > 1<<20 {
		bad("MinCount %d outside [1, %d]", c.MinCount, 1<<20)
	}
	if c.Data.Kind != MovieLens && (c.MinCount > 1 || c.UserDay == SwitchOn) {
		bad("MinCount and UserDay are for movielens data")
	}
	if c.BatchSize < 1 || c.BatchSize > 1<<16 {
		bad("BatchSize %d outside [1, %d]", c.BatchSize, 1<<16)
	}
	if c.Epochs < 1 {
		bad("Epochs %d must be positive", c.Epochs)
	}
	if c.Duration < 0 {
		bad("Duration %v is negative", c.Duration)
	}
	if c.Servers < 1 || c.Servers > 64 {
		bad("Servers %d outside [1, 64]", c.Servers)
	}
	if c.Workers < 1 || c.Workers > 256 {
		bad("Workers %d outside [1, 256]", c.Workers)
	}
	if c.Slots < c.Servers || c.Slots > 1<<20 {
		bad("Slots %d outside [Servers, %d]", c.Slots, 1<<20)
	}
	if c.ShardSize < 1 {
		bad("ShardSize %d must be positive", c.ShardSize)
	}
	if c.CheckpointDir == "" {
		bad("CheckpointDir is required")
	}
	if c.FullEvery < 1 {
		bad("FullEvery %d must be positive", c.FullEvery)
	}
	if c.LeaseTTL < time.Second {
		bad("LeaseTTL %v below 1s", c.LeaseTTL)
	}
	if _, err := parseEvaluate(c.Evaluate); err != nil {
		bad("%v", err)
	}
	if c.Evaluate != "" && c.Resume {
		bad("Evaluate loads a commit without training; Resume trains on from one: not both")
	}
	if c.EarlyStop > 0 && c.KeepBest == SwitchOff {
		bad("EarlyStop %d stops by the evaluations KeepBest takes, which is off", c.EarlyStop)
	}
	if c.KeepBest > SwitchOff {
		bad("unknown KeepBest %d", c.KeepBest)
	}
	if c.BestMetric > MetricAUC {
		bad("unknown BestMetric %d", c.BestMetric)
	}
	if c.ProgressEvery < 10*time.Millisecond {
		bad("ProgressEvery %v below 10ms", c.ProgressEvery)
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(append([]error{ErrConfig}, errs...)...)
}

// ScaleStep is one change of the cluster while it trains (Config.ScaleAt).
type ScaleStep struct {
	// At is the time after the start of training.
	At time.Duration
	// Servers and Workers are the counts asked for; 0 keeps the current one.
	Servers, Workers int
}

// ParseScaleAt reads steps written TIME:ps=N[,workers=M] and separated by ';', such as
// "20s:ps=3;40s:ps=2,workers=4".
func ParseScaleAt(s string) ([]ScaleStep, error) {
	var out []ScaleStep
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		at, rest, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("scale step %q: want TIME:ps=N[,workers=M]", part)
		}
		d, err := time.ParseDuration(at)
		if err != nil {
			return nil, fmt.Errorf("scale step %q: %w", part, err)
		}
		st := ScaleStep{At: d}
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			n, err := strconv.Atoi(v)
			if !ok || err != nil || n < 1 {
				return nil, fmt.Errorf("scale step %q: %q is not ps=N or workers=N with N >= 1", part, kv)
			}
			switch k {
			case "ps":
				st.Servers = n
			case "workers":
				st.Workers = n
			default:
				return nil, fmt.Errorf("scale step %q: unknown %q (ps or workers)", part, k)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// evaluateTarget is what Config.Evaluate names: the best commit, the newest, or a step.
type evaluateTarget struct {
	best, newest bool
	step         uint64
}

// parseEvaluate reads Config.Evaluate ("" is the zero target: train).
func parseEvaluate(s string) (evaluateTarget, error) {
	switch s {
	case "":
		return evaluateTarget{}, nil
	case "best":
		return evaluateTarget{best: true}, nil
	case "newest":
		return evaluateTarget{newest: true}, nil
	}
	step, err := strconv.ParseUint(s, 10, 64)
	if err != nil || step == 0 {
		return evaluateTarget{}, fmt.Errorf("Evaluate %q: want best, newest or the step of a commit", s)
	}
	return evaluateTarget{step: step}, nil
}
