package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
)

// options are the parsed command line.
type options struct {
	cfg   train.Config
	plain bool // log lines even on a terminal
	// defaultDir says -checkpoint-dir was not given: an embedded run then gets a directory of
	// its own under the default (runDir), and -resume or -evaluate the newest of them.
	defaultDir bool
	verbose    bool
	logJSON    bool // log records as JSON lines instead of text
	gossip     string
	seeds      string

	// One role per process (empty: the embedded cluster).
	role       string
	id         string
	listen     string
	psList     string
	dispatcher string
	secretFile string
	workers    int
	// kube runs the job's servers and workers as Kubernetes pods (-role coordinator in a pod),
	// and passOn is the command line the coordinator passes on to them: every flag it was given
	// but those that say which process it is (kubeRoleFlags).
	kube   bool
	passOn []string
	// psSize and workerSize are the requests and limits of the server and worker pods -kube
	// starts (zero: the template's own).
	psSize, workerSize elastic.Resources
	// autoscale runs the autoscaler on a -kube job, every autoscaleEvery, with a pending pod
	// answered after pendingFor.
	autoscale                  bool
	autoscaleEvery, pendingFor time.Duration
	nearMemory                 float64
}

// rawValue is a flag's value that also keeps what the command line gave it, each time: a flag
// defined with FlagSet.Func prints as "", and the coordinator passes the flags on as given.
type rawValue struct {
	flag.Value
	name string
	raw  map[string][]string
}

// String is the value's, and "" for the zero rawValue the flag package makes to find a flag's
// zero value for its help.
func (v *rawValue) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}

func (v *rawValue) Set(s string) error {
	v.raw[v.name] = append(v.raw[v.name], s)
	return v.Value.Set(s)
}

// IsBoolFlag keeps a boolean flag one that needs no value.
func (v *rawValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// parseFlags reads the command line into options. Every problem is reported at once.
func parseFlags(args []string, out io.Writer) (*options, error) {
	fs := flag.NewFlagSet("dlrm", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: dlrm [flags]\n\n"+
			"Trains a DLRM on an embedded cluster (2 parameter servers, 2 workers and the data-shard\n"+
			"dispatcher on loopback TCP) with flash checkpoints. Ctrl-C stops cleanly after a final\n"+
			"checkpoint; -resume continues from the newest one.\n\nflags:\n")
		fs.PrintDefaults()
	}
	var (
		o                                options
		ckDirSet, durationSet            bool
		data, test, bottom, top, scaleAt string
		embOpt, denseOpt, bestMetric     string
		fieldMap, badLines               string
		maxBad                           float64
		embLR, denseLR, embInit          float64
		testFraction, skew               float64
		seed                             uint64
		vocabCap                         int
	)
	c := &o.cfg
	fs.StringVar(&data, "data", "synthetic", "training data: synthetic, criteo:FILE[,FILE...], libsvm:FILE[,FILE...], libfm:FILE[,FILE...], movielens:DIR (ml-latest-small's CSV layout or the 100K layout of u.data and u.item) or movielens:DIR/RATINGS (one ratings file, such as the 100K layout's u1.base, with the movies in its directory)")
	fs.StringVar(&test, "test", "", "held-out file(s) for criteo, libsvm or libfm data, or for movielens a directory with its own ratings file (or a ratings file such as the 100K layout's u1.test) (default: a seeded random split of -data)")
	fs.BoolVar(&c.AllowOverlap, "allow-overlap", false, "train and report the test figure even when -test records are also in the training data, identical after parsing (without it such a run is refused before training, naming the count and the first file:line pairs)")
	fs.IntVar(&c.Fields, "fields", 0, "libfm data: the number of fields (default: the highest field index in the first MiB of the files, plus one)")
	fs.StringVar(&fieldMap, "field-map", "", "libsvm data: feature index ranges to fields, NAME=LO-HI[,NAME=LO-HI...], or a file of such entries one per line (default: every feature in one field)")
	fs.StringVar(&c.Pooling, "pooling", "", "libsvm and libfm data: pooling of the several features of one field, their rows weighted by their values: sum or mean (default sum; mean for libsvm without -field-map)")
	fs.StringVar(&badLines, "bad-lines", "skip", "a malformed line of text data: skip (count it, report it, stop when there are more than -max-bad) or fail (stop at the first)")
	fs.Float64Var(&maxBad, "max-bad", 100*train.DefaultMaxBadFraction, "with -bad-lines skip: stop when more than this percentage of a file's lines is malformed (or its first 1000 lines read all are)")
	fs.Float64Var(&testFraction, "test-fraction", train.DefaultTestFraction, "share of the data held out when there is no -test")
	fs.Float64Var(&c.ValidFraction, "valid", 0, fmt.Sprintf("carve a validation set, this share of the training data, that is not trained: evaluations while training, -keep-best and -early-stop score it instead of the test set, and both are on by default (-early-stop %d) (0: none)", train.DefaultEarlyStop))
	fs.IntVar(&c.TestRecords, "test-records", 0, "held-out records evaluated (default 20000 synthetic, 1000000 files)")
	fs.Int64Var(&c.TrainRecords, "train-records", train.DefaultTrainRecords, "synthetic training records")
	fs.Uint64Var(&seed, "seed", 1, "seed of the data, the split, the initial model and the shuffles")
	fs.IntVar(&c.EmbeddingDim, "dim", 0, "embedding dimension (and bottom MLP output width) (default per data: 32 movielens, else 16)")
	fs.StringVar(&bottom, "bottom", "64,32", `bottom MLP hidden layer widths ("none" for no hidden layer)`)
	fs.StringVar(&top, "top", "128,64", `top MLP hidden layer widths ("none" for logistic regression over the interactions)`)
	fs.StringVar(&embOpt, "emb-opt", "", "embedding optimizer: sgd, adagrad, rowwise-adagrad, adam or ftrl (default per data: adam for movielens, else adagrad)")
	fs.Float64Var(&embLR, "emb-lr", 0, "embedding learning rate (default per data: 0.005 movielens, else 0.05)")
	fs.Float64Var(&embInit, "emb-init", 0, "half-width of new embedding rows' uniform init (default per data: 0.03 movielens, else 0.1)")
	fs.StringVar(&denseOpt, "dense-opt", "", "MLP optimizer, applied on the parameter servers (default adagrad)")
	fs.Float64Var(&denseLR, "dense-lr", 0, "MLP learning rate (default per data: 0.005 movielens, else 0.02)")
	l2Flag := func(name, what string, dst *float32) {
		fs.Func(name, what+` weight decay (L2), applied on the parameter servers at each update: a number, or "none" (default per data: see the README)`, func(v string) error {
			if v == "none" {
				*dst = -1
				return nil
			}
			f, err := strconv.ParseFloat(v, 32)
			if err != nil || f < 0 || f > 10 {
				return fmt.Errorf("want a number in [0, 10] or none, not %q", v)
			}
			*dst = float32(f)
			if f == 0 {
				*dst = -1 // 0 given is none; the default is the flag not given
			}
			return nil
		})
	}
	l2Flag("emb-l2", "embedding rows'", &c.EmbeddingOptimizer.L2)
	l2Flag("dense-l2", "MLP", &c.DenseOptimizer.L2)
	switchFlag := func(name, what string, dst *train.Switch) {
		fs.Func(name, what, func(v string) error {
			switch v {
			case "on":
				*dst = train.SwitchOn
			case "off":
				*dst = train.SwitchOff
			default:
				return fmt.Errorf("want on or off, not %q", v)
			}
			return nil
		})
	}
	switchFlag("first-order", "on: a learned scalar per id beside its embedding row, pooled like it and added to the logit (a table of dimension 1 per field) (default off)", &c.FirstOrder)
	switchFlag("concat", "on or off: the pooled embedding vectors go into the top MLP beside the bottom output and their dot products (default on for movielens, else off)", &c.ConcatEmbeddings)
	switchFlag("user-day", "movielens data: on or off, a field of the user and the UTC day of the rating (default on)", &c.UserDay)
	fs.IntVar(&c.MinCount, "min-count", 0, fmt.Sprintf("movielens data: ids seen fewer than this many times in the training ratings share one row per field (default %d; 1: none)", train.DefaultMovieLensMinCount))
	fs.IntVar(&c.BatchSize, "batch", train.DefaultBatchSize, "records per worker step")
	fs.IntVar(&c.Epochs, "epochs", 0, "passes over the data (default 3 movielens, else 1)")
	fs.DurationVar(&c.Duration, "duration", time.Minute, "stop after this long; the summary then says how far the epochs got (0: when the epochs are done, the default for file data: criteo, libsvm, libfm and movielens run the -epochs asked for)")
	fs.IntVar(&c.Servers, "ps", train.DefaultServers, "parameter servers")
	fs.IntVar(&c.Workers, "workers", train.DefaultWorkers, "workers")
	fs.StringVar(&scaleAt, "scale-at", "", "change the cluster while it trains: TIME:ps=N[,workers=M], steps separated by ';' (e.g. 20s:ps=3;40s:ps=2): servers are added or drained with their slots moved live")
	fs.StringVar(&c.CheckpointDir, "checkpoint-dir", filepath.Join(os.TempDir(), "elasticps-dlrm"), "where checkpoints are persisted (default: a new directory under this one for each run; -resume and -evaluate take the newest)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", train.DefaultCheckpointEvery, "take a flash checkpoint every N steps, or after -checkpoint-interval if that comes first (0: none by steps; with -checkpoint-interval 0, only at the end)")
	fs.DurationVar(&c.CheckpointInterval, "checkpoint-interval", train.DefaultCheckpointInterval, "take a flash checkpoint after this much training time, or after -checkpoint-every steps if those come first (0: none by time), so that a slow run checkpoints too")
	fs.IntVar(&c.FullEvery, "full-every", train.DefaultFullEvery, "every Nth checkpoint is full, the others hold only changed rows")
	fs.BoolVar(&c.Resume, "resume", false, "restore the newest committed checkpoint of -checkpoint-dir and continue")
	fs.BoolVar(&c.Overwrite, "overwrite", false, "start afresh even if -checkpoint-dir holds an earlier run's checkpoints, deleting them (without it such a start is refused)")
	fs.BoolVar(&c.KeepShm, "keep-shm", false, "keep the shared-memory copies at exit (a resume on this host then reads them)")
	fs.Func("recovery", "when a parameter server fails: rollback (every server returns to the newest commit) or partial (only its slots do; their updates since are lost) (default rollback)", func(v string) error {
		switch v {
		case "rollback":
			c.Recovery = elastic.Rollback
		case "partial":
			c.Recovery = elastic.Partial
		default:
			return fmt.Errorf("want rollback or partial, not %q", v)
		}
		return nil
	})
	fs.StringVar(&c.ShmDir, "shm-dir", "", "the directory of the shared-memory checkpoint copies (default: one named after -checkpoint-dir under /dev/shm)")
	fs.DurationVar(&c.EvalEvery, "eval-every", train.DefaultEvalEvery, "evaluate the held-out set this often (0: only at the end)")
	keepBest := fs.Bool("keep-best", false, "evaluate the held-out set (the -valid set, if any) at every checkpoint (training paused) and mark the best commit by -best-metric; retention keeps it; the summary's test line reports the best commit's test figures beside the final model's (default: on with -valid or -early-stop; without -valid it chooses by the test set, which leaks the test set into the figure reported, so it is off unless asked for)")
	fs.StringVar(&c.Evaluate, "evaluate", "", "instead of training, load a commit of -checkpoint-dir and evaluate it: best (the commit -keep-best marked), newest, or a step; give the data and model flags of the run that wrote it")
	// The test records' labels and scores, for computing the AUC (or anything else) outside.
	fs.StringVar(&c.Predictions, "predictions", "", "write the final test evaluation to this file (temporary file and rename): a header line, then one line per test record in the test set's order, FILE:LINE (or the synthetic record's index, or for movielens the ratings file#rating index), its label (0 or 1) and the model's probability of a click, tab-separated; the model is the one the summary's test line reports: with -keep-best (on by default with -valid) the best commit, else the final model, or with -evaluate the commit loaded")
	fs.IntVar(&c.EarlyStop, "early-stop", 0, fmt.Sprintf("stop after this many evaluated checkpoints in a row without a better -best-metric (implies -keep-best; 0: never) (default %d with -valid and -keep-best on; without -valid never, since stopping by the test set leaks it)", train.DefaultEarlyStop))
	fs.StringVar(&bestMetric, "best-metric", "logloss", "the held-out figure -keep-best and -early-stop choose by: logloss (lower is better; it punishes the over-confidence of a model trained too long, which AUC does not see) or auc (higher is better)")
	fs.StringVar(&o.role, "role", "", "run one role of a multi-process job: ps, worker or coordinator (also called dispatcher) (default: the whole cluster in this process)")
	fs.StringVar(&o.id, "id", "", "-role ps: this server's ID in -servers; -role worker: a unique worker name")
	fs.StringVar(&o.listen, "listen", "", "-role ps or coordinator: the address to serve on (data and control share it)")
	fs.StringVar(&o.psList, "servers", "", "roles: every parameter server, ID=HOST:PORT,... (same list and order everywhere)")
	fs.StringVar(&o.dispatcher, "dispatcher", "", "-role worker: the coordinator's address")
	fs.StringVar(&o.gossip, "gossip", "", "roles: gossip membership on this address (HOST:PORT), so the coordinator hears of failures at once (default: no gossip; health checks find them)")
	fs.StringVar(&o.seeds, "seeds", "", "roles with -gossip: the -gossip addresses of the job's processes, HOST:PORT,... (the same list everywhere will do)")
	fs.BoolVar(&o.kube, "kube", false, "-role coordinator in a Kubernetes pod: start the job's -ps servers and -workers workers as pods like this one (same image, flags and volumes), hold the job's Lease, and leave the job running for the next coordinator when interrupted")
	fs.Func("ps-memory", "-kube: each server pod's memory request and limit, a Kubernetes quantity such as 512Mi (default: the coordinator pod's)", quantity(&o.psSize.Memory))
	fs.Func("ps-cpus", "-kube: each server pod's CPU request and limit, a Kubernetes quantity such as 1 or 500m (default: the coordinator pod's)", cpus(&o.psSize.CPUs))
	fs.Func("worker-memory", "-kube: each worker pod's memory request and limit (default: the coordinator pod's)", quantity(&o.workerSize.Memory))
	fs.Func("worker-cpus", "-kube: each worker pod's CPU request and limit (default: the coordinator pod's)", cpus(&o.workerSize.CPUs))
	fs.BoolVar(&o.autoscale, "autoscale", false, "-kube: answer what Kubernetes says of the job's pods (elastic/autoscale): a server killed for lack of memory comes back with more and restores its slots, a pod no node can hold for -pending-for is asked for smaller or given up; the counts stay within -ps and -workers")
	fs.DurationVar(&o.autoscaleEvery, "autoscale-every", 15*time.Second, "-autoscale: how often the autoscaler observes the job")
	fs.Float64Var(&o.nearMemory, "near-memory", autoscale.DefaultConfig().NearMemory, "-autoscale: the share of its memory limit a server may use before it is restarted larger, ahead of a kill; its use is what its pod's memory cgroup is charged, as the kernel counts it (above 1: only once killed)")
	fs.DurationVar(&o.pendingFor, "pending-for", autoscale.DefaultConfig().PendingFor, "-autoscale: how long a pod may wait for a node before it is asked for smaller or given up")
	fs.StringVar(&o.secretFile, "secret-file", "", "roles: file holding the cluster secret (the same file for every process; default: the environment variable "+SecretEnv+", never a flag's value)")
	fs.BoolVar(&o.plain, "plain", false, "print log lines instead of a progress bar even on a terminal")
	fs.BoolVar(&o.verbose, "v", false, "log the components' warnings and notices to stderr")
	fs.StringVar(&c.StatusAddr, "status-addr", train.CommandDefaults().StatusAddr, "the embedded run or -role coordinator: serve the live status page on this address (empty: none); off loopback it asks for the cluster secret's token")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve this process's Prometheus metrics on this address, at /metrics (empty: none)")
	logFormat := fs.String("log-format", "text", "the log records' format on stderr: text or json (each record names the job, role and node)")
	fs.Float64Var(&skew, "skew", 1.2, "synthetic data: Zipf exponent of the ids (larger is easier to learn)")
	fs.IntVar(&vocabCap, "vocab-cap", 20_000, "synthetic data: cap on each field's number of distinct ids (0: Criteo's own sizes, up to 100000)")
	raw := map[string][]string{} // each flag's values as given, for passOn
	fs.VisitAll(func(f *flag.Flag) { f.Value = &rawValue{Value: f.Value, name: f.Name, raw: raw} })
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	earlyStopSet := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "keep-best":
			c.KeepBest = train.SwitchOff
			if *keepBest {
				c.KeepBest = train.SwitchOn
			}
		case "early-stop":
			earlyStopSet = true
		}
		ckDirSet = ckDirSet || f.Name == "checkpoint-dir"
		durationSet = durationSet || f.Name == "duration"
		if !kubeRoleFlags[f.Name] {
			for _, v := range raw[f.Name] {
				o.passOn = append(o.passOn, "-"+f.Name+"="+v)
			}
		}
	})
	o.defaultDir = !ckDirSet
	var errs []error
	var err error
	switch *logFormat {
	case "text":
	case "json":
		o.logJSON = true
	default:
		errs = append(errs, fmt.Errorf("-log-format %q: text or json", *logFormat))
	}
	if c.ScaleAt, err = train.ParseScaleAt(scaleAt); err != nil {
		errs = append(errs, fmt.Errorf("-scale-at: %w", err))
	}
	if len(c.ScaleAt) > 0 && o.role != "" {
		errs = append(errs, errors.New("-scale-at is for the embedded cluster (no -role): a multi-process job is scaled through its coordinator (the status sub-command's control port)"))
	}
	if c.Data, err = train.ParseDataSpec(data); err != nil {
		errs = append(errs, fmt.Errorf("-data: %w", err))
	}
	if !durationSet && c.Data.Kind != train.Synthetic {
		c.Duration = 0 // file data: the epochs asked for; the minute is the synthetic demo's
	}
	if fieldMap != "" {
		if !strings.Contains(fieldMap, "=") { // a file of entries
			b, err := os.ReadFile(fieldMap)
			if err != nil {
				errs = append(errs, fmt.Errorf("-field-map: %w", err))
			}
			fieldMap = string(b)
		}
		c.FieldMap = fieldMap
	}
	if c.BestMetric, err = train.ParseMetric(bestMetric); err != nil {
		errs = append(errs, fmt.Errorf("-best-metric: %w", err))
	}
	if c.BadLines, err = train.ParseBadLinePolicy(badLines); err != nil {
		errs = append(errs, fmt.Errorf("-bad-lines: %w", err))
	}
	switch {
	case maxBad < 0 || maxBad > 100 || maxBad != maxBad:
		errs = append(errs, fmt.Errorf("-max-bad %v outside [0, 100]", maxBad))
	case maxBad == 0:
		c.MaxBadFraction = 1e-12 // no bad line allowed: the first stops the run, with the count so far
	default:
		c.MaxBadFraction = maxBad / 100
	}
	if test != "" {
		if c.TestFiles, err = train.SplitList(test); err != nil {
			errs = append(errs, fmt.Errorf("-test: %w", err))
		}
	}
	c.TestFraction, c.Seed = testFraction, seed
	if skew <= 1 {
		errs = append(errs, fmt.Errorf("-skew %v must be above 1", skew))
	}
	c.Synth.ZipfExponent = skew
	switch {
	case vocabCap < 0:
		errs = append(errs, fmt.Errorf("-vocab-cap %d is negative", vocabCap))
	case vocabCap > 0:
		c.Synth.Vocab = model.DefaultVocab()
		for i, v := range c.Synth.Vocab {
			c.Synth.Vocab[i] = min(v, vocabCap)
		}
	}
	if c.BottomHidden, err = parseWidths(bottom); err != nil {
		errs = append(errs, fmt.Errorf("-bottom: %w", err))
	}
	if c.TopHidden, err = parseWidths(top); err != nil {
		errs = append(errs, fmt.Errorf("-top: %w", err))
	}
	if c.EmbeddingOptimizer.Kind, err = parseOptimizer(embOpt); err != nil {
		errs = append(errs, fmt.Errorf("-emb-opt: %w", err))
	}
	if c.DenseOptimizer.Kind, err = parseOptimizer(denseOpt); err != nil {
		errs = append(errs, fmt.Errorf("-dense-opt: %w", err))
	}
	for name, v := range map[string]float64{"-emb-lr": embLR, "-dense-lr": denseLR, "-emb-init": embInit} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", name, v))
		}
	}
	c.EmbeddingOptimizer.LearningRate, c.DenseOptimizer.LearningRate, c.EmbeddingInit = float32(embLR), float32(denseLR), float32(embInit)
	if c.Duration < 0 {
		errs = append(errs, fmt.Errorf("-duration %v is negative", c.Duration))
	}
	switch {
	case c.CheckpointEvery == 0:
		c.CheckpointEvery = -1 // only the final checkpoint
	case c.CheckpointEvery < 0:
		errs = append(errs, fmt.Errorf("-checkpoint-every %d is negative", c.CheckpointEvery))
	}
	switch {
	case c.CheckpointInterval == 0:
		c.CheckpointInterval = -1 // none by time
	case c.CheckpointInterval < 0:
		errs = append(errs, fmt.Errorf("-checkpoint-interval %v is negative", c.CheckpointInterval))
	}
	switch {
	case c.EvalEvery == 0:
		c.EvalEvery = -1
	case c.EvalEvery < 0:
		errs = append(errs, fmt.Errorf("-eval-every %v is negative", c.EvalEvery))
	}
	if o.autoscale && !o.kube {
		errs = append(errs, errors.New("-autoscale is for -role coordinator -kube: it answers what Kubernetes says of the pods"))
	}
	if !(o.nearMemory > 0) {
		errs = append(errs, fmt.Errorf("-near-memory %v is not positive", o.nearMemory))
	}
	if o.autoscaleEvery <= 0 || o.pendingFor <= 0 {
		errs = append(errs, fmt.Errorf("-autoscale-every %v and -pending-for %v must be positive", o.autoscaleEvery, o.pendingFor))
	}
	if !o.kube && (o.psSize != elastic.Resources{} || o.workerSize != elastic.Resources{}) {
		errs = append(errs, errors.New("-ps-memory, -ps-cpus, -worker-memory and -worker-cpus size the pods -kube starts"))
	}
	switch o.role {
	case "":
	case "ps", "worker", "coordinator", "dispatcher":
		if o.secretFile == "" && os.Getenv(SecretEnv) == "" {
			errs = append(errs, fmt.Errorf("-role needs -secret-file or the environment variable %s", SecretEnv))
		}
		if o.psList == "" && !o.kube {
			errs = append(errs, errors.New("-role needs -servers (or, for the coordinator on Kubernetes, -kube)"))
		}
		if o.kube && o.role != "coordinator" {
			errs = append(errs, errors.New("-kube is for -role coordinator: it starts the other roles' pods"))
		}
		if o.kube && o.psList != "" {
			errs = append(errs, errors.New("-kube starts the servers: give their number with -ps, not -servers"))
		}
		if o.role != "worker" && o.listen == "" {
			errs = append(errs, fmt.Errorf("-role %s needs -listen", o.role))
		}
		if o.role == "worker" && (o.dispatcher == "" || o.id == "") {
			errs = append(errs, errors.New("-role worker needs -dispatcher and -id"))
		}
		if o.role == "ps" && o.id == "" {
			errs = append(errs, errors.New("-role ps needs -id"))
		}
		if o.seeds != "" && o.gossip == "" {
			errs = append(errs, errors.New("-seeds needs -gossip"))
		}
	default:
		errs = append(errs, fmt.Errorf("-role %q: want ps, worker or coordinator", o.role))
	}
	if c.Resume && c.Overwrite {
		errs = append(errs, errors.New("-resume continues the checkpoints -overwrite would delete: give one of them"))
	}
	switch {
	case c.EarlyStop < 0:
		errs = append(errs, fmt.Errorf("-early-stop %d is negative", c.EarlyStop))
	case c.EarlyStop == 0 && earlyStopSet:
		c.EarlyStop = -1 // 0 given is never; the default is the flag not given
	}
	if c.MinCount < 0 {
		errs = append(errs, fmt.Errorf("-min-count %d is negative", c.MinCount))
	}
	o.workers = c.Workers
	if len(errs) == 0 {
		if err := c.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &o, nil
}

// parseWidths reads "64,32" as layer widths; "none" is no hidden layer.
func parseWidths(s string) ([]int, error) {
	if s == "none" {
		return []int{}, nil
	}
	parts, err := train.SplitList(s)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("layer width %q is not a positive integer", p)
		}
		out[i] = n
	}
	return out, nil
}

// parseOptimizer reads an optimizer name; "" keeps the default.
func parseOptimizer(s string) (embedding.OptimizerKind, error) {
	if s == "" {
		return 0, nil
	}
	k, err := embedding.ParseOptimizer(strings.ToLower(s))
	if err != nil {
		return 0, fmt.Errorf("unknown optimizer %q (want sgd, adagrad, rowwise-adagrad, adam or ftrl)", s)
	}
	return k, nil
}

// quantity returns a flag's Set that parses a Kubernetes quantity of bytes ("512Mi") into *to.
func quantity(to *int64) func(string) error {
	return func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%q is not a positive quantity of bytes such as 512Mi", s)
		}
		*to = q.Value()
		return nil
	}
}

// cpus returns a flag's Set that parses a Kubernetes quantity of cores ("2", "500m") into *to.
func cpus(to *float64) func(string) error {
	return func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%q is not a positive number of cores such as 2 or 500m", s)
		}
		*to = float64(q.MilliValue()) / 1000
		return nil
	}
}
