package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/internal/kubetest"
	"github.com/elasticps/elasticps/internal/wait"
)

// kubePSMemory is each server pod's memory (-ps-memory): what an OOM kill grows by the
// scaler's OOMGrowth.
const kubePSMemory = "256Mi"

// runKube runs the DLRM example as a job on a local Kubernetes control plane (internal/kubetest:
// etcd, kube-apiserver and kube-scheduler built from their Go modules, and a node agent that
// runs each pod as a local process in a memory cgroup) and measures, in each round, against
// the same run's baseline:
//
//   - pod_deleted: a server's pod deleted (kubectl delete pod): from the delete call to the
//     first step after the recovery (the scaler replaces the pod, the coordinator rolls the
//     job back to its newest commit);
//   - oom_killed: a server OOM-killed by the kernel for its pod's memory limit (a memory hog
//     in the pod's cgroup fills it, the server made the OOM killer's first choice: see
//     kube_hog.go): from the kill to the first step after the recovery onto the replacement
//     pod, which the scaler gives 1.5 times the memory;
//   - scale_out: the coordinator asked for a third server (SetPlan, as dlrm scale does): from
//     the request to the first step after the new server owns its slots (checked to have
//     served rows); the job trains on meanwhile, and the steps it trained are reported;
//   - the baseline, stop_restart: stop everything (every pod of the job killed, the Lease
//     deleted) and recreate the coordinator's pod with -resume, which recreates the servers
//     and workers and restores the newest commit from storage: from the stop to the first
//     step. For scale_out the restart asks for three servers (stop_restart_3).
//
// A round runs pod_deleted, oom_killed, stop_restart, stop_restart_3, a live scale-in back to
// two servers (scale_in_s, for scale) and scale_out, so that each ratio pairs an event with the
// baseline of its own round. Each also gets the time until the step count passes the step
// before the event (caught up: the steps rolled back are trained again). The scaler's own cost per pod (scaler_pod: a plan
// of one server to its pod Running) is set against the same pod created directly (bare_pod).
// The control plane's start, and the build of its binaries (build-tools.sh, cached after the
// first), are reported. Times are medians over the rounds (3; 1 with -quick); every time is
// read by polling every kubePollEvery. The suite needs Linux and root (the node agent), and
// fails if an event did not happen as described.
func runKube(ctx context.Context, opt options, r *report) error {
	rounds := 3
	if opt.quick {
		rounds = 1
	}
	dir, err := os.MkdirTemp(opt.dir, "bench-kube-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	built, buildTook, toolsDir, err := buildKubeTools(ctx)
	if err != nil {
		return err
	}
	if built == 0 {
		r.add("control_plane_tools_cached", 1, "the control plane's binaries were in build-tools.sh's cache: nothing built this run")
		if took, ok := cachedBuildTime(ctx, toolsDir); ok {
			r.add("control_plane_cached_build_s", took.Seconds(), "s the cached binaries' build took, read from file times (the cache directory made as build-tools.sh started, to the newest binary written): wall time on this machine as it then was, with whatever Go build cache it had (the script's note: about 25 CPU-minutes with an empty one)")
		}
	} else {
		r.add("control_plane_build_s", buildTook.Seconds(), fmt.Sprintf("s for build-tools.sh to build %d of the control plane's 4 binaries", built))
	}
	fmt.Printf("kube: build-tools.sh built %d binaries in %.1f s\n", built, buildTook.Seconds())
	start := time.Now()
	bin, err := buildDLRM(ctx, dir)
	if err != nil {
		return err
	}
	r.add("dlrm_build_s", time.Since(start).Seconds(), "s to build the dlrm example, the pods' image (go build, with the Go build cache as found)")

	start = time.Now()
	cp, err := kubetest.Launch(ctx, kubetest.Options{})
	if err != nil {
		return err
	}
	defer cp.Stop()
	fmt.Printf("kube: dlrm built, control plane started in %.1f s\n", cp.StartTime.Seconds())
	r.add("control_plane_start_s", cp.StartTime.Seconds(), fmt.Sprintf("s from etcd's start to etcd, kube-apiserver and kube-scheduler ready (%.2f s with the certificates and directories)", time.Since(start).Seconds()))
	start = time.Now()
	node, err := cp.RunNode(ctx, "bench-node", kubetest.NodeOptions{
		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("32Gi")},
		Images:   map[string]string{kubeImage: bin},
	})
	if err != nil {
		return err
	}
	defer node.Stop()
	r.add("node_agent_start_s", time.Since(start).Seconds(), "s to register the node and start its agent")

	ckpt := filepath.Join(dir, "checkpoints")
	if err := os.Mkdir(ckpt, 0o777); err != nil {
		return err
	}
	j := &kubeJob{cp: cp, node: node, ns: "bench-kube", name: "bench", coordName: "bench-coordinator", ckptDir: ckpt, psMemory: kubePSMemory}
	if err := j.setUp(ctx); err != nil {
		return err
	}
	defer func() {
		if j.ctl != nil {
			j.ctl.Close()
		}
	}()

	fmt.Println("kube: node agent up")
	s := samples{}
	for round := range rounds {
		sc, bare, err := j.scalerOverhead(ctx, round)
		if err != nil {
			return fmt.Errorf("scaler overhead: %w", err)
		}
		s["scaler_pod"] = append(s["scaler_pod"], ckMillis(sc))
		s["bare_pod"] = append(s["bare_pod"], ckMillis(bare))
	}

	fmt.Printf("kube: scaler %.0f ms, bare pod %.0f ms to Running\n", s.median("scaler_pod"), s.median("bare_pod"))
	start = time.Now()
	if err := j.startCoordinator(ctx, 2, false); err != nil {
		return err
	}
	if _, _, err := j.awaitStatus(ctx, "the first step", func(st elastic.Status) bool { return st.Step > 0 }); err != nil {
		return fmt.Errorf("%w%s", err, j.logs(context.WithoutCancel(ctx)))
	}
	r.add("job_start_to_first_step_s", time.Since(start).Seconds(), "s from the coordinator's pod created to the first step (2 servers, 2 workers; for scale)")

	var scaleIn []float64
	for round := range rounds {
		fmt.Printf("kube: round %d of %d\n", round+1, rounds)
		steps := []struct {
			name string
			run  func() (resumed, caught time.Duration, err error)
		}{
			{"pod_deleted", func() (time.Duration, time.Duration, error) { return j.podDeleted(ctx, elastic.ServerID(1)) }},
			{"oom_killed", func() (time.Duration, time.Duration, error) { return j.oomKilled(ctx, elastic.ServerID(1), r) }},
			{"stop_restart", func() (time.Duration, time.Duration, error) { return j.stopRestart(ctx, 2, 2) }},
			{"stop_restart_3", func() (time.Duration, time.Duration, error) { return j.stopRestart(ctx, 2, 3) }},
			{"", func() (time.Duration, time.Duration, error) {
				d, err := j.scaleIn(ctx)
				scaleIn = append(scaleIn, ckMillis(d))
				return 0, 0, err
			}},
			{"scale_out", func() (time.Duration, time.Duration, error) { return j.scaleOut(ctx, r) }},
		}
		if round < rounds-1 {
			steps = append(steps, steps[4]) // back to 2 servers for the next round
		}
		for _, st := range steps {
			resumed, caught, err := st.run()
			if err != nil {
				name := st.name
				if name == "" {
					name = "scale_in"
				}
				return fmt.Errorf("round %d, %s: %w%s", round, name, err, j.logs(context.WithoutCancel(ctx)))
			}
			if st.name != "" {
				s[st.name] = append(s[st.name], ckMillis(resumed))
				s[st.name+"_caught_up"] = append(s[st.name+"_caught_up"], ckMillis(caught))
				if st.name == "scale_out" {
					fmt.Printf("kube:   %-15s %6.0f ms to the first step\n", st.name, ckMillis(resumed))
				} else {
					fmt.Printf("kube:   %-15s %6.0f ms to the first step, %6.0f ms to catch up\n", st.name, ckMillis(resumed), ckMillis(caught))
				}
			}
		}
	}

	const restart = "stop every pod of the job (killed, grace 0), delete the Lease, recreate the coordinator's pod with -resume: it recreates the servers and workers and restores the newest commit from storage"
	r.add("stop_restart_s", s.median("stop_restart")/1000, "s from the stop to the first step: "+restart+" (2 servers)")
	r.add("stop_restart_caught_up_s", s.median("stop_restart_caught_up")/1000, "s from the stop until the step count passes the step before it")
	r.add("stop_restart_3_s", s.median("stop_restart_3")/1000, "s, the same restarted with 3 servers (the job's commits were taken on 2): the DLRover way to scale out")
	events := []struct{ name, base, note string }{
		{"pod_deleted", "stop_restart", "s from a server's pod deleted (grace as the scaler set it) to the first step after the recovery (Rollback: the replacement restores from storage, the other server from its shared memory)"},
		{"oom_killed", "stop_restart", "s from the kernel's OOM kill of a server (its pod at " + kubePSMemory + ") to the first step after the recovery onto a pod of more memory"},
		{"scale_out", "stop_restart_3", "s from SetPlan (3 servers) to the first step with the third server owning its slots; training goes on meanwhile"},
	}
	for _, e := range events {
		r.add(e.name+"_to_resumed_s", s.median(e.name)/1000, e.note)
		r.addRatio(e.name+"_vs_stop_restart", s.ratio(e.name, e.base), restart, e.base+"_s", e.name+" over "+e.base+" in the same round (below 1: faster than the baseline)")
		if e.name != "scale_out" {
			r.add(e.name+"_caught_up_s", s.median(e.name+"_caught_up")/1000, "s until the step count passes the step before the event")
			r.addRatio(e.name+"_caught_up_vs_stop_restart", s.ratio(e.name+"_caught_up", e.base+"_caught_up"), restart, e.base+"_caught_up_s", "the same, until caught up")
		}
	}
	r.add("scale_in_s", ckMedian(scaleIn)/1000, "s for SetPlan (2 servers) to move every slot off the third server and delete its pod; training goes on (no baseline: for scale)")
	r.add("scaler_pod_s", s.median("scaler_pod")/1000, "s from a kube.Scaler's Scale call (a plan of one server) to its pod Running")
	r.add("bare_pod_s", s.median("bare_pod")/1000, "s from creating the same pod directly to Running: the apiserver, the scheduler and the node agent's process start")
	r.addRatio("scaler_pod_vs_bare_pod", s.ratio("scaler_pod", "bare_pod"), "the same pod spec created directly with client-go", "bare_pod_s", "the scaler's time to a running pod over the bare pod's")

	t := sweepTable{About: "ms per round: each event to the first step after it, the baselines, and a pod's start by the scaler and bare",
		Columns: []string{"round", "pod_deleted", "oom_killed", "stop_restart", "scale_out", "stop_restart_3", "scaler_pod", "bare_pod"}}
	for i := range rounds {
		row := []float64{float64(i)}
		for _, c := range t.Columns[1:] {
			row = append(row, math.Round(s[c][i]))
		}
		t.Rows = append(t.Rows, row)
	}
	r.addTable("rounds", t)

	if err := j.stopAll(ctx); err != nil {
		return fmt.Errorf("stop the job: %w", err)
	}
	return nil
}

// podDeleted deletes server id's pod and times the recovery.
func (j *kubeJob) podDeleted(ctx context.Context, id string) (resumed, caught time.Duration, err error) {
	st0, err := j.steady(ctx, 2)
	if err != nil {
		return 0, 0, err
	}
	p, err := j.pod(ctx, id)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := j.cp.Client.CoreV1().Pods(j.ns).Delete(ctx, p.Name, deleteDefault); err != nil {
		return 0, 0, err
	}
	return j.recovered(ctx, st0, id, "Deleted", start)
}

// oomKilled has the kernel kill server id for its pod's memory limit and times the recovery;
// it checks the replacement pod's memory limit and records its growth.
func (j *kubeJob) oomKilled(ctx context.Context, id string, r *report) (resumed, caught time.Duration, err error) {
	st0, err := j.steady(ctx, 2)
	if err != nil {
		return 0, 0, err
	}
	p, err := j.pod(ctx, id)
	if err != nil {
		return 0, 0, err
	}
	limit := p.Spec.Containers[0].Resources.Limits.Memory().Value()
	pid, cg := j.node.Pid(j.ns, p.Name), j.node.CgroupDir(j.ns, p.Name, "memory")
	if pid == 0 || cg == "" || limit == 0 {
		return 0, 0, fmt.Errorf("server %s: pid %d, memory cgroup %q, limit %d: %w", id, pid, cg, limit, errNotDone)
	}
	// The hog takes a while to fill the pod's memory, and the job trains on meanwhile: the step
	// to catch up with is the last one before the kill, read while the hog runs.
	before := make(chan uint64, 1)
	pctx, stop := context.WithCancel(ctx)
	go func() {
		last := st0.Step
		for wait.Sleep(pctx, kubePollEvery) == nil {
			if st, err := j.ctl.Status(pctx); err == nil && st.Recoveries == st0.Recoveries && st.ServerFailures == st0.ServerFailures {
				last = max(last, st.Step)
			}
		}
		before <- last
	}()
	killed, err := oomKill(ctx, cg, pid, 2*limit)
	stop()
	st0.Step = <-before
	if err != nil {
		return 0, 0, err
	}
	resumed, caught, err = j.recovered(ctx, st0, id, "OOMKilled", killed)
	if err != nil {
		return 0, 0, err
	}
	np, err := j.pod(ctx, id)
	if err != nil {
		return 0, 0, err
	}
	grown := float64(np.Spec.Containers[0].Resources.Limits.Memory().Value()) / float64(limit)
	if np.UID == p.UID || grown < 1.4 {
		return 0, 0, fmt.Errorf("server %s's pod after the OOM kill: new %v, memory limit %.2f times the old: %w", id, np.UID != p.UID, grown, errNotDone)
	}
	r.add("oom_memory_growth", grown, "the replacement pod's memory limit over the OOM-killed pod's (the scaler's OOMGrowth)")
	return resumed, caught, nil
}

// recovered waits for the first step after a recovery of server id that started after st0,
// and then for the step count to pass st0's, and returns both times from start. The
// recovery's reason is checked to be about id, and to say why.
func (j *kubeJob) recovered(ctx context.Context, st0 elastic.Status, id, why string, start time.Time) (resumed, caught time.Duration, err error) {
	st, at, err := j.awaitStatus(ctx, "the recovery", func(st elastic.Status) bool {
		return st.Recoveries > st0.Recoveries && st.Phase == "training" && st.LastRecovery != nil && st.Step > st.LastRecovery.Step
	})
	if err != nil {
		return 0, 0, err
	}
	if reason, ok := st.LastRecovery.Failed[id]; !ok || !strings.Contains(reason, why) {
		return 0, 0, fmt.Errorf("the recovery was of %v, not of %s %s: %w", st.LastRecovery.Failed, id, why, errNotDone)
	}
	resumed = at.Sub(start)
	_, at, err = j.awaitStatus(ctx, "the steps rolled back", func(st elastic.Status) bool { return st.Step > st0.Step })
	return resumed, at.Sub(start), err
}

// stopRestart stops the job of from servers and starts it again from its newest commit with
// to servers: the baseline.
func (j *kubeJob) stopRestart(ctx context.Context, from, to int) (resumed, caught time.Duration, err error) {
	st0, err := j.steady(ctx, from)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := j.stopAll(ctx); err != nil {
		return 0, 0, err
	}
	if err := j.startCoordinator(ctx, to, true); err != nil {
		return 0, 0, err
	}
	_, at, err := j.awaitStatus(ctx, "the restarted job's first step", func(st elastic.Status) bool {
		return workerSteps(st) > 0 && len(st.Servers) == to && st.Step > st0.LastCommit
	})
	if err != nil {
		return 0, 0, err
	}
	resumed = at.Sub(start)
	_, at, err = j.awaitStatus(ctx, "the steps lost", func(st elastic.Status) bool { return st.Step > st0.Step })
	return resumed, at.Sub(start), err
}

// scaleOut asks the coordinator for a third server and waits for a step with its slots on it.
func (j *kubeJob) scaleOut(ctx context.Context, r *report) (resumed, caught time.Duration, err error) {
	st0, err := j.steady(ctx, 2)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, kubeWaitFor)
	defer cancel()
	if err := j.ctl.SetPlan(sctx, j.plan(3)); err != nil {
		return 0, 0, err
	}
	stR, _, err := j.awaitStatus(ctx, "the new owner table", func(st elastic.Status) bool { return owns(st, elastic.ServerID(2)) })
	if err != nil {
		return 0, 0, err
	}
	_, at, err := j.awaitStatus(ctx, "a step with the third server", func(st elastic.Status) bool {
		return st.Step > stR.Step && owns(st, elastic.ServerID(2))
	})
	if err != nil {
		return 0, 0, err
	}
	u, err := j.ctl.Usage(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, sv := range u.Servers {
		if sv.ID == elastic.ServerID(2) && sv.Busy == 0 {
			return 0, 0, fmt.Errorf("the third server owns slots and has served nothing: %w", errNotDone)
		}
	}
	r.add("scale_out_steps_meanwhile", float64(stR.Step-st0.Step), "steps the job trained between the scale-out request and the new owner table (last round)")
	if rp := u.Repartition; rp != nil && rp.To == 3 && rp.Err == "" {
		r.add("scale_out_repartition_s", rp.Duration.Seconds(), fmt.Sprintf("s of the repartition as the coordinator reports it: %d slots moved in %d groups, %d rows (last round)", rp.SlotsDone, rp.Groups, rp.MovedRows))
		r.add("scale_out_max_fenced_ms", ckMillis(rp.MaxFenced), "ms the longest a group of slots was refused while handed to the new server: the only pause of training on those slots (last round)")
	}
	return at.Sub(start), at.Sub(start), nil
}

// scaleIn asks the coordinator to go back to two servers.
func (j *kubeJob) scaleIn(ctx context.Context) (time.Duration, error) {
	if _, err := j.steady(ctx, 3); err != nil {
		return 0, err
	}
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, kubeWaitFor)
	defer cancel()
	if err := j.ctl.SetPlan(sctx, j.plan(2)); err != nil {
		return 0, err
	}
	took := time.Since(start)
	st, err := j.ctl.Status(ctx)
	if err != nil {
		return 0, err
	}
	if owns(st, elastic.ServerID(2)) || len(st.Servers) != 2 {
		return 0, fmt.Errorf("after SetPlan to 2 servers: %d servers, ps-2 owns slots %v: %w", len(st.Servers), owns(st, elastic.ServerID(2)), errNotDone)
	}
	return took, nil
}

// plan is the job's plan with servers servers, sized as the coordinator's flags size them.
func (j *kubeJob) plan(servers int) elastic.Plan {
	return elastic.Plan{Servers: servers, Workers: 2, Server: elastic.Resources{Memory: j.psBytes()}}
}

// owns reports whether server id owns slots in the status's owner table.
func owns(st elastic.Status, id string) bool {
	for _, o := range st.Owners {
		if o == id {
			return true
		}
	}
	return false
}

// buildKubeTools runs build-tools.sh, which builds the control plane's binaries that its cache
// lacks, and returns how many it built, how long it took and the cache directory.
func buildKubeTools(ctx context.Context) (built int, took time.Duration, dir string, err error) {
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", kubetest.BuildScript)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, 0, "", fmt.Errorf("%s (run from the repository's root): %w: %s", kubetest.BuildScript, err, stderr.String())
	}
	m := regexp.MustCompile(`(\d+) of \d+ binaries built`).FindStringSubmatch(stderr.String())
	if m == nil {
		return 0, 0, "", fmt.Errorf("%s said %q: %w", kubetest.BuildScript, stderr.String(), errors.ErrUnsupported)
	}
	built, _ = strconv.Atoi(m[1])
	return built, time.Since(start), strings.TrimSpace(stdout.String()), nil
}

// cachedBuildTime reads how long the build of the cached binaries in dir took from the files'
// times: from the directory's creation (build-tools.sh makes it as it starts) to the newest
// binary's last write. ok is false where the file system keeps no creation time.
func cachedBuildTime(ctx context.Context, dir string) (took time.Duration, ok bool) {
	out, err := exec.CommandContext(ctx, "stat", "-c", "%W", dir).Output()
	if err != nil {
		return 0, false
	}
	born, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil || born <= 0 {
		return 0, false
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var last time.Time
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.ModTime().After(last) {
			last = fi.ModTime()
		}
	}
	took = last.Sub(time.Unix(born, 0))
	return took, took > 0
}

// buildDLRM builds the dlrm example into dir, as the image of examples/k8s/Dockerfile holds it.
func buildDLRM(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "dlrm")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/elasticps/elasticps/examples/dlrm")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the dlrm example: %w: %s", err, out)
	}
	return bin, nil
}
