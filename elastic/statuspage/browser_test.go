package statuspage_test

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/elastic/statuspage"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// chromiumPath is where Debian's chromium package puts the browser (CI installs it).
const chromiumPath = "/usr/bin/chromium"

// screenshotEnv names a file the browser test writes its screenshot to as well (the README's
// picture is made so).
const screenshotEnv = "ELASTICPS_SCREENSHOT"

// chromium returns the browser to drive. A machine without it skips the test, but CI, which
// installs it, fails.
func chromium(t *testing.T) string {
	t.Helper()
	path := chromiumPath
	if _, err := os.Stat(path); err != nil {
		found, lerr := exec.LookPath("chromium")
		if lerr != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("the browser test needs chromium (apt-get install chromium), and CI must run it: %v", err)
			}
			t.Skipf("no chromium at %s or on PATH: the browser test does not run (apt-get install chromium)", path)
		}
		path = found
	}
	return path
}

// publicListener reports an address other hosts reach, so that Serve asks for the token,
// while it listens on loopback.
type publicListener struct{ net.Listener }

func (publicListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 8080} }

// gatedServer holds the first owner table that gives it slots until the test releases it:
// the move onto it stays under way (its slots migrating) until the page has shown that.
type gatedServer struct {
	elastic.ParameterServer
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *gatedServer) InstallTable(ctx context.Context, t *ps.OwnerTable) error {
	if owns(t, g.Node().ID) {
		g.once.Do(func() { close(g.held) })
		select {
		case <-g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.ParameterServer.InstallTable(ctx, t)
}

// owns reports whether t gives server id a slot.
func owns(t *ps.OwnerTable, id string) bool {
	for sl := range t.Slots {
		if t.Owner(sl).ID == id {
			return true
		}
	}
	return false
}

// label is the click of id: a third of the items are clicked.
func label(id uint64) float32 {
	if (id*2654435761>>7)%3 == 0 {
		return 1
	}
	return 0
}

// auc is the area under the ROC curve of scores against labels (the share of positive and
// negative pairs the scores order right, ties counting half); NaN without both classes.
func auc(scores []float64, labels []float32) float64 {
	var right, pairs float64
	for i := range scores {
		for j := range scores {
			if labels[i] == 1 && labels[j] == 0 {
				pairs++
				switch {
				case scores[i] > scores[j]:
					right++
				case scores[i] == scores[j]:
					right += 0.5
				}
			}
		}
	}
	return right / pairs
}

// The page in a real browser, over a job that trains in this process: it logs in with the
// token, shows the members, the owner grid and the charts with live values, a recovery after a
// server is killed, a third server and the slots migrating onto it, and writes no error to the
// console.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	secret := []byte("the browser test's cluster secret, long enough")

	page, err := statuspage.New(statuspage.Config{Secret: secret, Every: 200 * time.Millisecond})
	require.NoError(t, err)
	store, err := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))
	require.NoError(t, err)
	const dim, items, records = 8, 4000, 50_000
	job, err := local.Start(ctx, local.Config{Job: "ctr-demo", Servers: 2, Slots: 256, Secret: secret,
		Tables: []ps.TableSpec{{Name: "item", Config: embedding.Config{Dim: dim, Seed: 3,
			Optimizer: embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}}}},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 300, Recovery: elastic.Rollback,
			Dispatcher:   shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 1000, Epochs: 100},
			OnCheckpoint: page.ObserveCheckpoint, OnRecovery: page.ObserveRecovery},
		Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")},
	})
	require.NoError(t, err)
	defer job.Close()
	page.SetSource(job.Coordinator())

	data := shard.IndexedSource{Data: shard.IndexedFunc(records, func(i int64, rec *shard.Record) error {
		id := uint64(i*7919) % items
		rec.Label = label(id)
		if uint64(i)*2246822519>>11%5 == 0 {
			rec.Label = 1 - rec.Label // a fifth of the clicks are noise: the model cannot learn them
		}
		rec.IDs = append(rec.IDs, id)
		rec.EndField()
		return nil
	})}
	// A logistic model of one embedding per item: the loss and the AUC of each batch's
	// predictions, made before it trains on them, go to the page.
	step := func(ctx context.Context, b *elastic.Batch) error {
		rows := make([]float32, dim*len(b.IDs))
		if err := b.Pull(ctx, "item", b.IDs, rows); err != nil {
			return err
		}
		grads := make([]float32, len(rows))
		scores := make([]float64, len(b.IDs))
		var loss float64
		for i := range b.IDs {
			var z float64
			for _, w := range rows[i*dim : (i+1)*dim] {
				z += float64(w)
			}
			p, y := 1/(1+math.Exp(-z)), float64(b.Labels[i])
			loss -= y*math.Log(p+1e-9) + (1-y)*math.Log(1-p+1e-9)
			for k := range dim {
				grads[i*dim+k] = float32(p-y) / dim
			}
			scores[i] = p
		}
		page.Observe("loss", loss/float64(len(b.IDs)))
		page.Observe("auc", auc(scores, b.Labels)) // NaN (a batch of one class) is dropped
		return b.Push(ctx, "item", b.IDs, grads)
	}
	scaler, err := local.NewScaler(local.ScalerConfig{Job: job, MaxRestarts: 10,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 64} },
		Worker: func(string) (local.StepFunc, error) { return step, nil }})
	require.NoError(t, err)
	defer scaler.Close()
	job.SetScaler(scaler)
	coord := job.Coordinator()
	require.NoError(t, coord.SetParallelism(ctx, 2, 2))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String() + "/"
	sctx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- page.Serve(sctx, publicListener{ln}) }()
	defer func() {
		stopServe()
		assert.ErrorIs(t, <-served, context.Canceled)
	}()

	// The browser: Debian's chromium, headless, with a profile of its own; no background
	// traffic (the machine may have no network).
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1280, 900))...)
	defer cancelAlloc()
	bctx, closeBrowser := chromedp.NewContext(actx)
	defer closeBrowser()
	var console struct {
		sync.Mutex
		msgs []chromedp.ConsoleMessage
	}
	consoleCtx, stopConsole := context.WithCancel(bctx)
	messages := chromedp.Console(consoleCtx)
	var readers sync.WaitGroup
	readers.Go(func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			console.Lock()
			console.msgs = append(console.msgs, m)
			console.Unlock()
		}
	})
	waitFor := func(what, predicate string) {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](predicate,
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(40*time.Second)))
		require.NoError(t, err, "the page never showed %s", what)
	}
	eval := func(js string) map[string]any {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]any](js))
		require.NoError(t, err)
		return v
	}

	// Log in: the page is on a public address, so it asks for the token.
	require.NoError(t, chromedp.Do(bctx, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), statuspage.Token(secret))))
	resp, err := chromedp.RunResponse(bctx, chromedp.Submit(chromedp.CSS("#login"))) // waits for the page it leads to
	require.NoError(t, err)
	require.Equal(t, int64(200), resp.Status, "the login leads to the page")
	waitFor("the job after the login", `!!document.getElementById("job")`)

	// Live values: members, the grid of two owners, the three charts, a checkpoint.
	const js = `const job = document.getElementById("job");
		const chart = s => (document.querySelector('figure[data-series="' + s + '"]') || {dataset: {}}).dataset;
		const member = id => document.querySelector('tr[data-member="' + id + '"]');`
	waitFor("live values", `(() => {`+js+`
		return job.dataset.servers === "2" && job.dataset.workers === "2" && Number(job.dataset.step) > 0 &&
			Number(job.dataset.checkpoints) > 0 && Number(chart("throughput").points) >= 2 && Number(chart("throughput").last) > 0 &&
			Number(chart("loss").points) >= 2 && Number(chart("auc").points) >= 2 &&
			document.querySelectorAll("#owners path[data-owner]").length === 2 &&
			!!member("ps-0") && !!member("ps-1") && member("worker-0").dataset.health !== undefined && !!member("worker-1");
	})()`)
	live := eval(`(() => {` + js + `
		return {slots: Number(job.dataset.slots), loss: Number(chart("loss").last), auc: Number(chart("auc").last),
			host: member("ps-0").children[2].textContent, health: member("ps-0").dataset.health,
			legend: Array.from(document.querySelectorAll(".legend li[data-owner]"), li => li.textContent.trim())};
	})()`)
	assert.Equal(t, 256.0, live["slots"])
	assert.Greater(t, live["loss"], 0.0)
	assert.GreaterOrEqual(t, live["auc"], 0.0)
	assert.LessOrEqual(t, live["auc"], 1.0)
	assert.NotEmpty(t, live["host"], "the servers' counters are read (Usage)")
	assert.Equal(t, "serving", live["health"])
	assert.Len(t, live["legend"], 2)
	t.Logf("live values after %v: %v", time.Since(start).Round(time.Millisecond), live)

	// A server is killed and comes back: the job rolls back to its newest commit.
	require.NoError(t, job.KillServer(1))
	require.NoError(t, job.RestartServer(ctx, 1))
	waitFor("the recovery", `(() => {`+js+`
		const r = document.querySelector("tr.recovery");
		return job.dataset.recoveries === "1" && job.dataset.serving === "2" && !!r &&
			r.textContent.includes("ps-1") && r.textContent.includes("rollback");
	})()`)
	t.Logf("recovery shown after %v", time.Since(start).Round(time.Millisecond))

	// A third server: its slots stay migrating until the page has shown them.
	added, err := job.StartServers(ctx, 1)
	require.NoError(t, err)
	gate := &gatedServer{ParameterServer: added[0], held: make(chan struct{}), release: make(chan struct{})}
	moved := make(chan error, 1)
	go func() { moved <- coord.AddServers(ctx, gate) }()
	waitFor("the slots migrating", `(() => {`+js+`
		return job.dataset.servers === "3" && Number(job.dataset.migrating) > 0 &&
			!!document.querySelector("#owners path.migrating") && !!document.querySelector(".legend li.moving") &&
			!!member("ps-2");
	})()`)
	shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	close(gate.release)
	require.NoError(t, <-moved)
	waitFor("the move done", `(() => {`+js+`
		return job.dataset.servers === "3" && job.dataset.serving === "3" && job.dataset.migrating === "0" &&
			!!document.querySelector('#owners path[data-owner="ps-2"]') &&
			Array.from(document.querySelectorAll(".log li"), li => li.textContent).some(t => t.includes("servers 2 → 3"));
	})()`)
	t.Logf("scale-out shown after %v", time.Since(start).Round(time.Millisecond))

	snap, err := statuspage.Fetch(ctx, url, secret)
	require.NoError(t, err)
	assert.Zero(t, snap.Status.ExactlyOnceViolations)
	assert.Len(t, snap.Status.Servers, 3)

	stopConsole()
	readers.Wait()
	console.Lock()
	for _, m := range console.msgs {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("the page wrote to the console: %s (%s:%d)", m, m.URL, m.Line+1)
		} else {
			t.Logf("console: %s", m)
		}
	}
	console.Unlock()

	// The screenshot, made smaller: in the test's directory, and where ELASTICPS_SCREENSHOT
	// says (the README's picture).
	img, err := png.Decode(bytes.NewReader(shot))
	require.NoError(t, err)
	var small bytes.Buffer
	require.NoError(t, (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&small, img))
	require.NoError(t, os.WriteFile(filepath.Join(t.TempDir(), "statuspage.png"), small.Bytes(), 0o644))
	if path := os.Getenv(screenshotEnv); path != "" {
		require.NoError(t, os.WriteFile(path, small.Bytes(), 0o644))
		t.Logf("screenshot written to %s (%d bytes, %v)", path, small.Len(), img.Bounds().Size())
	}
	closeBrowser()
	if err := chromedp.Cancel(bctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("closing the browser: %v", err)
	}
}
