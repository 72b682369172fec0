package train

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

// ErrNoCheckpoint is returned by Run with Resume when the checkpoint directory holds no
// committed checkpoint that can be restored.
var ErrNoCheckpoint = errors.New("train: no checkpoint to resume from")

// ErrMismatch is returned by Run with Resume when the checkpoint was taken by a run with another
// data set or model shape.
var ErrMismatch = errors.New("train: checkpoint from a different job")

// ErrNotExactlyOnce is returned by Run, with the summary, when the exactly-once check fails.
var ErrNotExactlyOnce = errors.New("train: exactly-once check failed")

// run is one training run of the embedded cluster.
type run struct {
	cfg    Config
	logger *slog.Logger
	data   *dataSet
	mcfg   model.Config
	tables []string // server-side embedding table names, one per field
	dense  []denseTensor

	srvs     *servers
	secret   []byte
	disp     *shard.Dispatcher
	dispSrv  *shardnet.Server
	dispAddr string
	dispWG   sync.WaitGroup
	admin    *ps.Client
	ckpts    *checkpoints
	ledger   *ledger
	gate     gate
	clock    *pausableClock // the dispatcher's: stands still while the gate is closed
	eval     *evaluator
	workers  []*worker

	start     time.Time
	steps     atomic.Int64 // the model's steps: the checkpoint step
	samples   atomic.Int64 // the model's samples
	baseSteps int64        // restored
	baseSamp  int64

	mu       sync.Mutex // interval figures
	lossSum  float64
	lossN    int
	lastSamp int64
	lastTick time.Time

	restoredStep uint64
	restoredFrom string

	emitMu   sync.Mutex
	lastEval Eval
	haveEval bool
	lastBlk  time.Duration
}

func (r *run) nextStep() uint32 { return uint32(r.steps.Add(1)) }

func (r *run) trained(n int, loss float64) {
	r.samples.Add(int64(n))
	r.mu.Lock()
	r.lossSum += loss
	r.lossN++
	r.mu.Unlock()
}

// Run trains a DLRM on an embedded cluster — cfg.Servers parameter servers and the data-shard
// dispatcher serving on loopback TCP with a fresh cluster secret, and cfg.Workers workers —
// until ctx ends (an interrupt), cfg.Duration passes or the epochs are done. It checkpoints every
// cfg.CheckpointEvery steps and once more at the end, evaluates the held-out set, and returns
// the summary. With cfg.Resume it first restores the newest committed checkpoint: tables, MLP,
// data position and the exactly-once ledger. Everything it starts is stopped and joined before
// it returns.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	r := &run{cfg: cfg, logger: cfg.Logger, ledger: newLedger(), clock: newPausableClock(nil)}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	return r.train(ctx)
}

// setUp loads the data, starts the servers and the dispatcher, creates the MLP on the servers,
// opens the checkpoints and restores one when asked.
func (r *run) setUp(ctx context.Context) error {
	cfg := &r.cfg
	var err error
	if r.data, err = loadData(ctx, cfg); err != nil {
		return err
	}
	r.mcfg = model.Config{
		DenseFeatures: r.data.dense, Fields: len(r.data.fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, FieldPooling: r.data.pooling, Seed: cfg.Seed,
	}
	m0, err := model.New(r.mcfg)
	if err != nil {
		return err
	}
	r.mcfg = m0.Config()
	r.dense = denseTensors(m0)
	specs := tableSpecs(r.data.fields, cfg.EmbeddingDim, cfg.Seed, cfg.EmbeddingOptimizer, cfg.EmbeddingInit)
	for _, s := range specs {
		r.tables = append(r.tables, s.Name)
	}
	r.secret = make([]byte, 32)
	rand.Read(r.secret)
	if r.srvs, err = startServers(cfg.Servers, cfg.Slots, r.secret, specs, r.logger); err != nil {
		return err
	}
	if r.admin, err = r.srvs.client(0); err != nil {
		return err
	}
	if err := initDense(ctx, r.admin, r.dense, m0.Params(), cfg.DenseOptimizer); err != nil {
		return err
	}
	r.disp, err = shard.New(shard.Config{
		Dataset: r.data.dataset, ShardSize: cfg.ShardSize, Epochs: cfg.Epochs, Seed: cfg.Seed,
		Shuffle: true, ShuffleRecords: r.data.shuffle, LeaseTTL: cfg.LeaseTTL, Clock: r.clock, Logger: r.logger,
	})
	if err != nil {
		return err
	}
	if err := r.serveDispatcher(); err != nil {
		return err
	}
	if r.ckpts, err = openCheckpoints(ctx, cfg, r.srvs, r.tables, r.emitCheckpoint); err != nil {
		return err
	}
	if r.data.synth != nil {
		// Fault in shared memory for the expected rows now rather than at the first snapshot.
		rows := int64(0)
		for _, v := range r.data.synth.Config().Vocab {
			rows += int64(v)
		}
		t, _ := r.srvs.list[0].Table(r.tables[0])
		per := rows * int64(t.RawRowSize()) * 5 / 4 / int64(cfg.Servers)
		if err := r.ckpts.reserve(ctx, per); err != nil {
			return fmt.Errorf("reserve shared memory: %w", err)
		}
	}
	if r.eval, err = r.newEvaluator(); err != nil {
		return err
	}
	if cfg.Resume {
		return r.restore(ctx)
	}
	return nil
}

// serveDispatcher serves the dispatcher on a loopback TCP port with the cluster secret; the
// workers reach it through shardnet clients, as they would a remote coordinator.
func (r *run) serveDispatcher() error {
	srv, err := shardnet.NewServer(shardnet.ServerConfig{Service: r.disp, Secret: r.secret, Logger: r.logger})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return err
	}
	r.dispSrv, r.dispAddr = srv, l.Addr().String()
	r.dispWG.Add(1)
	go func() {
		defer r.dispWG.Done()
		if err := srv.Serve(l); err != nil {
			r.logger.Error("dispatcher server stopped", "err", err)
		}
	}()
	return nil
}

func (r *run) newEvaluator() (*evaluator, error) {
	cli, err := r.srvs.client(0)
	if err != nil {
		return nil, err
	}
	return newEvaluator(r.mcfg, cli, r.tables, r.dense, r.data.test)
}

// runMeta is saved with every checkpoint.
type runMeta struct {
	Version     int    `json:"version"`
	Fingerprint string `json:"fingerprint"`
	Step        int64  `json:"step"`
	Samples     int64  `json:"samples"`
}

// fingerprint names what must not change between a checkpoint and a resume.
func (r *run) fingerprint() string {
	c := &r.cfg
	synth := ""
	if c.Data.Kind == Synthetic {
		synth = fmt.Sprintf(" synth=%v/%v/%v/%v/%v/%v/%v", c.Synth.DenseFeatures, c.Synth.Vocab, c.Synth.Hotness, c.Synth.ZipfExponent,
			c.Synth.LatentDim, c.Synth.Signal, c.Synth.PositiveRate)
	}
	return fmt.Sprintf("data=%s%s test=%v/%v/%d train=%d seed=%d shard=%d fields=%s dense=%d dim=%d bottom=%v top=%v init=%v",
		c.Data, synth, c.TestFiles, c.TestFraction, c.TestRecords, c.TrainRecords, c.Seed, c.ShardSize,
		strings.Join(r.data.fields, ","), r.mcfg.DenseFeatures, r.mcfg.EmbeddingDim, r.mcfg.BottomHidden, r.mcfg.TopHidden, c.EmbeddingInit)
}

// restore loads the newest committed checkpoint into the servers, the dispatcher and the ledger.
func (r *run) restore(ctx context.Context) error {
	var meta runMeta
	res, err := r.ckpts.restore(ctx, func(b []byte) error {
		if err := json.Unmarshal(b, &meta); err != nil {
			return fmt.Errorf("run description: %w", err)
		}
		if fp := r.fingerprint(); meta.Fingerprint != fp {
			return fmt.Errorf("%w: the checkpoint was taken with\n  %s\nthis run has\n  %s", ErrMismatch, meta.Fingerprint, fp)
		}
		return nil
	})
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return fmt.Errorf("%w in %s", ErrNoCheckpoint, r.cfg.CheckpointDir)
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	n, err := restoreDense(ctx, r.admin, res.dense, func(string) bool { return true }, func(name string) (*embedding.Table, bool) {
		srv := r.srvs.ownerOf(name)
		if srv == nil {
			return nil, false
		}
		return srv.Table(name)
	})
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if n != len(r.dense) {
		return fmt.Errorf("restore: the checkpoint holds %d MLP tensors, the model has %d", n, len(r.dense))
	}
	if err := r.disp.Restore(res.dispatcher); err != nil {
		return fmt.Errorf("restore: dispatcher: %w", err)
	}
	if r.ledger, err = decodeLedger(res.ledger); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	r.steps.Store(meta.Step)
	r.samples.Store(meta.Samples)
	r.baseSteps, r.baseSamp = meta.Step, meta.Samples
	var from []string
	for node, src := range res.sources {
		from = append(from, fmt.Sprintf("%s: %s", node, src))
	}
	sort.Strings(from)
	r.restoredFrom = strings.Join(from, ", ")
	r.restoredStep = res.step
	r.emit(Event{Kind: EventRestore, Message: fmt.Sprintf("restored checkpoint of step %d (%d samples trained): %d table rows (%s), %d MLP tensors, data position and ledger",
		res.step, meta.Samples, res.records, r.restoredFrom, n)})
	return nil
}
