package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// ErrNoCheckpoint is returned by Run with Resume when the checkpoint directory holds no
// committed checkpoint that can be restored.
var ErrNoCheckpoint = errors.New("train: no checkpoint to resume from")

// ErrMismatch is returned by Run with Resume when the checkpoint was taken by a run with another
// data set or model shape.
var ErrMismatch = errors.New("train: checkpoint from a different job")

// ErrNotExactlyOnce is returned by Run, with the summary, when the exactly-once check fails.
var ErrNotExactlyOnce = errors.New("train: exactly-once check failed")

// ErrNothingTrained is returned by Run, with the summary and no evaluation, when the model was
// trained on no sample at all (the data has no line, or no line that is not malformed or held
// out, or the run stopped before its first step); and when loading data that holds no line.
var ErrNothingTrained = errors.New("train: nothing was trained")

// run is one training run of the embedded cluster.
type run struct {
	cfg       Config
	logger    *slog.Logger // the run's own records
	jobLogger *slog.Logger // the logger the local job's parts tag
	data      *dataSet
	mcfg      model.Config
	tables    sparseTables // server-side names of the sparse fields' tables
	dense     []denseTensor

	job   *local.Job
	shm   shmPlace // the shared-memory tier (dir "" until placed)
	admin *ps.Client
	ck    ckStats
	// eval scores the set that evaluations during training, keep-best and early stopping use:
	// the validation set when there is one, else the test set (testEval).
	eval, testEval *evaluator
	scaler         *local.Scaler // the workers
	watch          watch         // the status page
	metrics        *metered      // the Prometheus metrics

	start    time.Time
	samples  atomic.Int64 // the model's samples
	baseSamp int64        // restored

	mu sync.Mutex // interval figures, repartitions
	// repartitions are the changes of the server count made so far.
	repartitions []elastic.RepartitionStatus
	lossSum      float64
	lossN        int
	lastSamp     int64
	lastTick     time.Time

	restoredStep uint64
	restoredFrom string

	// commits reads the checkpoint directory's commits and keeps the pin of the best one
	// (pinned: the step pinned by this run, 0 before).
	commits *checkpoint.Committer
	pinned  uint64

	// best follows the evaluated commits (Config.KeepBest); evalErr is the first failure of an
	// evaluation at a snapshot; earlyStop is signalled when Config.EarlyStop evaluations in a
	// row did not improve on the best.
	best      keepBest
	evalErr   atomic.Pointer[error]
	earlyStop chan CommitEval // the best commit

	emitMu   sync.Mutex
	lastEval Eval
	haveEval bool
	lastBlk  time.Duration
}

func (r *run) trained(worker string, st stepFigures) {
	r.watch.step(st)
	r.metrics.step(worker, st)
	r.samples.Add(int64(st.samples))
	r.mu.Lock()
	r.lossSum += st.loss
	r.lossN++
	r.mu.Unlock()
}

// steps returns the model's steps (batches applied and reported, restored ones included).
func (r *run) steps() int64 {
	if r.job == nil {
		return 0
	}
	return int64(r.job.Coordinator().Status().Step)
}

// Run trains a DLRM on an embedded cluster — a coordinator (package elastic) with its data-shard
// dispatcher, cfg.Servers parameter servers serving on loopback TCP with a fresh cluster secret,
// and cfg.Workers workers — until ctx ends (an interrupt), cfg.Duration passes or the epochs are
// done. It checkpoints every cfg.CheckpointEvery steps or cfg.CheckpointInterval, whichever comes
// first, and once more at the end, evaluates the
// held-out set, and returns the summary. With cfg.Resume it first restores the newest committed
// checkpoint: tables, MLP, data position and the exactly-once ledger. Everything it starts is
// stopped and joined before it returns.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	cfg.resolveBest()
	if cfg.Predictions != "" {
		if err := checkPredictionsPath(cfg.Predictions); err != nil {
			return nil, err
		}
	}
	r := &run{cfg: cfg, jobLogger: cfg.Logger, earlyStop: make(chan CommitEval, 1), metrics: &metered{}}
	r.best.metric = cfg.BestMetric
	if r.jobLogger == nil {
		r.jobLogger = discardLogger()
	}
	// The local job names each part in its records; the run's own are the coordinator's side.
	r.logger = r.jobLogger.With("job", jobName, "role", elastic.RoleCoordinator.String(), "node", elastic.CoordinatorID)
	s, err := r.runOnce(ctx)
	if cfg.Evaluate == "" && r.bestElsewhere(s) && (err == nil || errors.Is(err, ErrNotExactlyOnce)) {
		if perr := r.testBest(ctx, s); perr != nil {
			return s, perr
		}
	}
	return s, err
}

// runOnce sets the run up, trains or evaluates, and stops and joins everything it started.
func (r *run) runOnce(ctx context.Context) (*Summary, error) {
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	if r.cfg.Evaluate != "" {
		return r.evaluate(ctx)
	}
	return r.train(ctx)
}

// bestElsewhere says whether the best commit of a trained and evaluated run s is not its
// final model, so that its test figures need a load of their own (testBest).
func (r *run) bestElsewhere(s *Summary) bool {
	return r.cfg.keepBest() && s != nil && s.Eval.Samples > 0 && s.Best != nil && s.Best.Step != uint64(s.Steps)
}

// testBest loads the best commit of the run s summarises into fresh servers, as Evaluate
// "best" does, scores the test set on it and adds the figures to s (BestTest), after the
// training job has stopped: the summary's test line then reports the best commit beside the
// final model, and the predictions are the best commit's. A failure to load or score it is a
// warning, and the final model's figures and predictions stand; only a failure to write the
// predictions is returned.
func (r *run) testBest(ctx context.Context, s *Summary) error {
	cfg := r.cfg
	cfg.Evaluate = strconv.FormatUint(s.Best.Step, 10)
	cfg.Resume, cfg.Overwrite, cfg.ScaleAt = false, false, nil
	cfg.StatusAddr, cfg.MetricsAddr, cfg.Predictions = "", "", ""
	e := &run{cfg: cfg, logger: r.logger, jobLogger: r.jobLogger, data: r.data, earlyStop: make(chan CommitEval, 1), metrics: &metered{}}
	r.emit(Event{Kind: EventNote, Message: fmt.Sprintf("loading the best commit (step %d) to score the test set on it", s.Best.Step)})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout) // an interrupted run reports its best too
	defer cancel()
	ev, err := e.scoreTest(ctx)
	if err != nil {
		s.BestTestErr = err.Error()
		r.emit(Event{Kind: EventWarning, Message: fmt.Sprintf("the best commit (step %d) could not be scored on the test set; the final model's figures are reported: %v", s.Best.Step, err)})
		return r.writePredictions(s, r.testEval)
	}
	ev.Trained = s.Best.Trained
	s.BestTest = &ev
	return r.writePredictions(s, e.testEval)
}

// scoreTest loads the commit of Config.Evaluate into fresh servers, scores the test set on it
// and stops everything it started.
func (r *run) scoreTest(ctx context.Context) (Eval, error) {
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return Eval{}, err
	}
	return r.testEval.run(ctx)
}

// setUp loads the data, starts the job (servers and coordinator), creates the MLP on the
// servers and restores a checkpoint when asked.
func (r *run) setUp(ctx context.Context) error {
	cfg := &r.cfg
	var err error
	if r.data == nil { // testBest's run scores the data of the run that trained
		if r.data, err = loadData(ctx, cfg); err != nil {
			return err
		}
		if err := r.data.checkOverlap(ctx, cfg.AllowOverlap); err != nil {
			return err
		}
	}
	r.mcfg = modelConfig(cfg, r.data)
	m0, err := model.New(r.mcfg)
	if err != nil {
		return err
	}
	r.mcfg = m0.Config()
	r.dense = denseTensors(m0)
	r.tables = newSparseTables(r.data.fields, cfg.firstOrder())
	specs := tableSpecs(cfg, r.data.fields)
	specs = append(specs, denseSpecs(r.dense, cfg.denseOptimizer())...)
	st, err := openStorage(ctx, cfg, r.logger)
	if err != nil {
		return err
	}
	// The best commit's pin (keep-best) and the commits Evaluate looks up; this committer
	// never commits nor prunes.
	if r.commits, err = checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: st, KeepLast: -1, Logger: r.logger}); err != nil {
		return err
	}
	if r.shm, err = prepareShm(cfg, "", r.logger); err != nil {
		return err
	}
	if r.metrics, err = newMetered(cfg.MetricsAddr, elastic.RoleCoordinator, elastic.CoordinatorID, true); err != nil {
		return err
	}
	r.job, err = local.Start(ctx, local.Config{
		Job: jobName, Servers: cfg.Servers, Tables: specs, Slots: cfg.Slots,
		Coordinator: elastic.Config{
			Storage: st, CheckpointEvery: max(cfg.CheckpointEvery, 0), CheckpointInterval: max(cfg.CheckpointInterval, 0),
			Logger: r.jobLogger, Recovery: cfg.Recovery,
			Dispatcher: r.dispatcherConfig(),
			JobState: func(step uint64) []byte {
				return r.jobState(context.WithoutCancel(ctx), step) // the final one follows an interrupt
			},
			CheckJob:     r.checkJob,
			OnCheckpoint: r.onCheckpoint,
			OnRecovery:   r.onRecovery,
		},
		Checkpoint: checkpoint.Config{ShmDir: r.shm.dir, FullEvery: cfg.FullEvery, OnStorageVerified: r.storageVerified},
		KeepShm:    cfg.KeepShm,
	})
	if err != nil {
		return err
	}
	if r.admin, err = r.job.Client(); err != nil {
		return err
	}
	if err := r.watch.startPage(ctx, cfg.StatusAddr, r.job.Secret(), jobSource{r.job}, r.logger); err != nil {
		return err
	}
	r.metrics.coordinator(jobSource{r.job})
	if err := r.metrics.localServers(r.job); err != nil {
		return err
	}
	if err := r.metrics.serve(ctx, cfg.MetricsAddr, r.logger); err != nil {
		return err
	}
	if r.data.synth != nil {
		// Fault in shared memory for the expected rows now rather than at the first snapshot.
		rows := int64(0)
		for _, v := range r.data.synth.Config().Vocab {
			rows += int64(v)
		}
		size := 0
		for _, names := range [][]string{r.tables.emb, r.tables.bias} { // an id's row in each
			if len(names) > 0 {
				t, _ := r.job.Servers[0].Server().Table(names[0])
				size += t.RawRowSize()
			}
		}
		per := rows * int64(size) * 5 / 4 / int64(cfg.Servers)
		for _, s := range r.job.Servers {
			if err := s.Reserve(ctx, per); err != nil {
				return fmt.Errorf("reserve shared memory: %w", err)
			}
		}
	}
	switch {
	case cfg.Resume:
		if err := r.restore(ctx); err != nil {
			return err
		}
	case cfg.Evaluate != "":
		if err := r.loadCommit(ctx); err != nil {
			return err
		}
	}
	// Every MLP tensor on its server: restored ones stay as they are (the first caller wins).
	if err := initDense(ctx, r.admin, r.dense, m0.Params(), cfg.denseOptimizer()); err != nil {
		return err
	}
	cli, err := r.job.Client()
	if err != nil {
		return err
	}
	if r.testEval, err = newEvaluator(r.mcfg, cli, r.tables, r.dense, r.data.test, "test"); err != nil {
		return err
	}
	r.eval = r.testEval
	if len(r.data.valid) > 0 {
		r.eval, err = newEvaluator(r.mcfg, cli, r.tables, r.dense, r.data.valid, "validation")
	}
	return err
}

// modelConfig is the model of cfg (defaults filled in) on data.
func modelConfig(cfg *Config, data *dataSet) model.Config {
	return model.Config{
		DenseFeatures: data.dense, Fields: len(data.fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, FieldPooling: data.pooling,
		FirstOrder: cfg.firstOrder(), ConcatEmbeddings: cfg.ConcatEmbeddings == SwitchOn, Seed: cfg.Seed,
	}
}

// dispatcherConfig is the data-shard dispatcher of the run's data.
func (r *run) dispatcherConfig() shard.Config {
	c := &r.cfg
	return shard.Config{
		Dataset: r.data.dataset, ShardSize: c.ShardSize, Epochs: c.Epochs, Seed: c.Seed,
		Shuffle: true, ShuffleRecords: r.data.shuffle, LeaseTTL: c.LeaseTTL, Logger: r.logger,
	}
}

// runMeta is saved with every checkpoint (the coordinator's job state).
type runMeta struct {
	Version     int    `json:"version"`
	Fingerprint string `json:"fingerprint"`
	Samples     int64  `json:"samples"`
	// With keep-best (Config.KeepBest): Eval is this commit's evaluation, Best the best
	// evaluated commit up to this one (this one included), Stale the evaluations since Best and
	// Evals the evaluations so far.
	Eval  *CommitEval `json:"eval,omitempty"`
	Best  *CommitEval `json:"best,omitempty"`
	Stale int         `json:"stale,omitempty"`
	Evals int         `json:"evals,omitempty"`
}

// jobState is called by the coordinator at every snapshot, training paused. With keep-best it
// evaluates the held-out set first, so the commit holds its own evaluation.
func (r *run) jobState(ctx context.Context, step uint64) []byte {
	meta := runMeta{Version: 2, Fingerprint: r.fingerprint(), Samples: r.samples.Load()}
	if r.cfg.keepBest() && r.eval != nil {
		r.evalSnapshot(ctx, step, &meta)
	} else if best, stale, evals := r.best.state(); best != nil {
		meta.Best, meta.Stale, meta.Evals = best, stale, evals // a resumed record goes on
	}
	b, _ := json.Marshal(meta)
	return b
}

// checkJob refuses a checkpoint of another job.
func (r *run) checkJob(b []byte) error {
	var meta runMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return fmt.Errorf("run description: %w", err)
	}
	if fp := r.fingerprint(); meta.Fingerprint != fp {
		return fmt.Errorf("%w: the checkpoint was taken with\n  %s\nthis run has\n  %s", ErrMismatch, meta.Fingerprint, fp)
	}
	return nil
}

// onRecovery hands a recovery to the status page and the metrics.
func (r *run) onRecovery(ev elastic.RecoveryEvent) {
	r.watch.recovery(ev)
	r.metrics.recovery(ev)
}

func (r *run) onCheckpoint(ev elastic.CheckpointEvent) {
	r.watch.checkpoint(ev)
	r.metrics.checkpoint(ev)
	out := r.ck.record(ev)
	if ev.Commit || ev.Err != nil { // a commit, or a snapshot that will not be committed
		stale := r.best.committed(ev.Step, ev.Commit && ev.Err == nil)
		r.pinBest()
		if best, _, _ := r.best.state(); best != nil {
			r.signalEarlyStop(*best, stale)
		}
	}
	kind := EventCheckpoint
	if ev.Commit {
		kind = EventCommit
	} else if ev.Err == nil {
		out.Applied = r.appliedBytes()
		r.emitMu.Lock()
		r.lastBlk = ev.Blocked
		r.emitMu.Unlock()
	}
	r.emit(Event{Kind: kind, Checkpoint: out})
}

// appliedBytes is the size of the embedded servers' records of the batches they applied,
// summed (0 without servers in this process).
func (r *run) appliedBytes() int64 {
	if r.job == nil {
		return 0
	}
	var n int64
	for _, srv := range r.job.Servers {
		n += int64(len(srv.Server().AppliedState(nil)))
	}
	return n
}

// fingerprint names what must not change between a checkpoint and a resume.
func (r *run) fingerprint() string {
	c := &r.cfg
	synth := ""
	if c.Data.Kind == Synthetic {
		synth = fmt.Sprintf(" synth=%v/%v/%v/%v/%v/%v/%v", c.Synth.DenseFeatures, c.Synth.Vocab, c.Synth.Hotness, c.Synth.ZipfExponent,
			c.Synth.LatentDim, c.Synth.Signal, c.Synth.PositiveRate)
	}
	valid := ""
	if c.ValidFraction > 0 {
		valid = fmt.Sprintf(" valid=%v", c.ValidFraction)
	}
	extra := ""
	if c.MinCount > 1 {
		extra += fmt.Sprintf(" min-count=%d", c.MinCount)
	}
	if c.firstOrder() {
		extra += " first-order"
	}
	if c.ConcatEmbeddings == SwitchOn {
		extra += " concat"
	}
	return fmt.Sprintf("data=%s%s test=%v/%v/%d%s train=%d seed=%d shard=%d fields=%s dense=%d dim=%d bottom=%v top=%v init=%v%s",
		c.Data, synth, c.TestFiles, c.TestFraction, c.TestRecords, valid, c.TrainRecords, c.Seed, c.ShardSize,
		strings.Join(r.data.fields, ","), r.mcfg.DenseFeatures, r.mcfg.EmbeddingDim, r.mcfg.BottomHidden, r.mcfg.TopHidden, c.EmbeddingInit, extra)
}

// storageVerified hears a server's background check of the storage copy of a commit it
// restored from shared memory.
func (r *run) storageVerified(step uint64, err error) {
	if err != nil {
		r.emit(Event{Kind: EventWarning, Message: fmt.Sprintf(
			"the commit of step %d was restored from shared memory, but its copy in %s is damaged (a restore on another host would skip it): %v",
			step, r.cfg.CheckpointDir, err)})
	}
}

// warnSkipped reports the commits a resume skipped and where they were moved.
func warnSkipped(res elastic.Resumed, dir string, emit func(Event)) {
	for i, s := range res.Skipped {
		where := "it could not be moved aside"
		if i < len(res.Quarantined) && res.Quarantined[i] != "" {
			where = fmt.Sprintf("moved aside to %s (delete that directory once examined)", filepath.Join(dir, filepath.FromSlash(res.Quarantined[i])))
		}
		emit(Event{Kind: EventWarning, Message: fmt.Sprintf("resume skipped the commit of step %d, which cannot be restored: %v; %s", s.Step, s.Err, where)})
	}
}

// restore loads the newest committed checkpoint into the servers and the coordinator.
func (r *run) restore(ctx context.Context) error {
	res, err := r.job.Coordinator().ResumeReport(ctx)
	warnSkipped(res, r.cfg.CheckpointDir, r.emit)
	step, raw := res.Step, res.Job
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return fmt.Errorf("%w in %s", ErrNoCheckpoint, r.cfg.CheckpointDir)
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := checkBatch(res.BatchSize, r.cfg.BatchSize); err != nil {
		return err
	}
	var meta runMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return fmt.Errorf("restore: run description: %w", err)
	}
	dense := 0
	for _, d := range r.dense {
		for _, s := range r.job.Servers {
			if t, ok := s.Server().Table(d.name); ok && t.Len() > 0 {
				dense++
				break
			}
		}
	}
	if dense != len(r.dense) {
		return fmt.Errorf("restore: the checkpoint holds %d of the model's %d MLP tensors", dense, len(r.dense))
	}
	r.samples.Store(meta.Samples)
	r.baseSamp = meta.Samples
	r.best.restore(meta)
	if r.cfg.keepBest() {
		r.pinBest() // the record goes on: a pin lost to a crash after its commit comes back
	}
	sources := map[string]checkpoint.Source{}
	var rows int64
	for _, s := range r.job.Servers {
		res := s.Restored()
		for node, src := range res.Sources {
			sources[node] = src
		}
		for _, n := range res.Records {
			rows += n
		}
	}
	var from []string
	for node, src := range sources {
		from = append(from, fmt.Sprintf("%s: %s", node, src))
	}
	sort.Strings(from)
	r.restoredFrom = strings.Join(from, ", ")
	r.restoredStep = step
	msg := fmt.Sprintf("restored checkpoint of step %d (%d samples trained): %d table rows (%s), %d MLP tensors, data position and ledger",
		step, meta.Samples, rows, r.restoredFrom, dense)
	if b := meta.Best; b != nil {
		msg += fmt.Sprintf("; the best evaluated commit so far is of step %d (AUC %.4f, log loss %.4f; chosen by %s), %d evaluations since", b.Step, b.AUC, b.LogLoss, r.cfg.BestMetric, meta.Stale)
	}
	r.emit(Event{Kind: EventRestore, Message: msg})
	return nil
}

// checkBatch refuses a resume whose batch size is not the one the checkpoint was trained with
// (resumed, 0 when it records none): a batch's position is its exact record range, so every
// worker is refused, and it is better said before training starts.
func checkBatch(resumed, batch int) error {
	if resumed > 0 && resumed != batch {
		return fmt.Errorf("%w: the checkpoint was trained with batches of %d records, this run reads batches of %d: resume with the checkpoint's batch size", ErrMismatch, resumed, batch)
	}
	return nil
}

// pinBest pins the best committed evaluation when it is not pinned yet, so that retention keeps
// it. The commit is the newest when it becomes the best, so no prune can delete it before the
// pin lands. A failure is a warning: the commit may then be deleted later, nothing else.
func (r *run) pinBest() {
	best, _, _ := r.best.state()
	if best == nil || best.Step == r.pinned || r.commits == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.commits.Pin(ctx, best.Step); err != nil {
		r.emit(Event{Kind: EventWarning, Message: fmt.Sprintf("could not mark the best commit (step %d) for retention to keep: %v", best.Step, err)})
		return
	}
	r.pinned = best.Step
}
