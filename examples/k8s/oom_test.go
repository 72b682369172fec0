package k8s_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
	"github.com/elasticps/elasticps/internal/wait"
)

// oomData makes the servers' memory grow with their rows: 64-wide rows of Criteo's own
// vocabularies. Without a limit, a server's resident memory is near 90 MiB after a few commits
// and levels off near 160 MiB once the first epoch has made its rows (its memory cgroup is
// charged less: shared checkpoint pages count once), so oomLimit is gone over in the first
// epoch, after the first commits, and 1.5 times it holds the server to the end (should it not,
// the next replacement has 1.5 times more again).
var oomData = map[string]string{"-train-records": "12000", "-dim": "64", "-vocab-cap": "0"}

const oomLimit = 112 << 20

// A server whose memory limit is too small for its rows is killed by the kernel (its pod
// OOMKilled, exit code 137) while the job trains; the scaler replaces the pod at once with 1.5
// times the limit, the coordinator restores the job from its newest commit onto the
// replacement (Rollback: every server's rows, the killed one's from storage), and the
// autoscaler, told of the kill by the scaler, makes 1.5 times the limit the plan's server size
// without restarting the server again (every restart of the job is a kernel's kill). The job
// trains on to its end, every position once.
func TestServerOOMKilledComesBackLarger(t *testing.T) {
	cp, node, ctx, ns := start(t, "oom")
	// The near-limit rule is off (-near-memory 100): both servers really outgrow oomLimit, and
	// with it on the autoscaler restarts one larger (its cgroup charged 95% of the limit) just
	// before the kernel kills the other; this test is of the kill.
	flags := map[string]string{"-ps-memory": fmt.Sprint(oomLimit), "-autoscale": "true", "-autoscale-every": "1s", "-near-memory": "100"}
	for k, v := range oomData {
		flags[k] = v
	}
	job, secret := deploy(t, ctx, cp, ns, flags)
	logs := func() string { return podLogs(context.WithoutCancel(ctx), cp, node, ns) }
	coord := coordinatorReady(t, ctx, cp, ns, job)
	ctl, err := remote.NewControl(remote.Config{Addr: net.JoinHostPort(coord.Status.PodIP, "7071"), Secret: secret})
	require.NoError(t, err)
	defer ctl.Close()

	killed, err := awaitPod(ctx, cp, ns, kube.LabelRole+"=ps", oomKilled)
	require.NoError(t, err, "a server is OOM-killed\n%s", logs())
	seen := time.Now()
	id := killed.Labels[kube.LabelNode]
	term := killed.Status.ContainerStatuses[0].State.Terminated
	assert.Equal(t, int32(137), term.ExitCode)
	assert.Equal(t, "OOMKilled", term.Reason)
	killedLimit := killed.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
	assert.Equal(t, int64(oomLimit), killedLimit.Value(), "the limit it went over")

	var repl *corev1.Pod
	for err = kubetest.ErrPodDeleted; errors.Is(err, kubetest.ErrPodDeleted); { // the killed pod goes first
		repl, err = cp.WaitPod(ctx, ns, killed.Name, func(p *corev1.Pod) bool {
			return p.UID != killed.UID && p.Status.Phase == corev1.PodRunning
		})
	}
	require.NoError(t, err, "%s comes back\n%s", id, logs())
	running := time.Now()
	assert.Equal(t, "1", repl.Annotations[kube.AnnotationRestart], "the replacement is the next incarnation")
	limit := repl.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
	assert.Equal(t, int64(oomLimit*3/2), limit.Value(), "the replacement has 1.5 times the limit: %s", limit.String())

	st := awaitStatus(t, ctx, ctl, "the recovery", func(st elastic.Status) bool {
		if st.LastRecovery == nil {
			return false
		}
		_, ok := st.LastRecovery.Failed[id]
		return ok
	})
	resumed := time.Now()
	rec := st.LastRecovery
	assert.Equal(t, elastic.Rollback, rec.Policy)
	assert.Contains(t, rec.Failed, id, "the recovery was of the killed server")
	assert.Contains(t, rec.Failed[id], "OOMKilled")
	assert.Contains(t, rec.Replaced, id, "its slots went back to it, restored, not to the other server")
	assert.Positive(t, rec.Step, "restored from a commit, not afresh")
	t.Logf("%s killed at %s; replacement running %v later with %s; job resumed from the commit of step %d %v after the kill (recovery %v, replacement wait %v)",
		id, killedLimit.String(), running.Sub(seen).Round(time.Millisecond), limit.String(), rec.Step, resumed.Sub(seen).Round(time.Millisecond),
		rec.Duration.Round(time.Millisecond), rec.Replacement.Round(time.Millisecond))

	st = awaitStatus(t, ctx, ctl, "the autoscaler's plan: the servers get 1.5 times the limit from then on", func(st elastic.Status) bool {
		return st.Plan.Server.Memory >= int64(oomLimit*3/2)
	})
	assert.Equal(t, 2, st.Plan.Servers)

	// Each server reports its pod's memory cgroup: its limit, and a charge within it, which the
	// autoscaler holds against the limit (its resident memory may read above the limit: it
	// counts the flash checkpoint's shared memory, charged to the cgroup that first touched it).
	u := awaitUsage(t, ctx, ctl)
	for _, s := range u.Servers {
		t.Logf("%s: resident %.1f MiB, cgroup charge %.1f MiB of a %.1f MiB limit, tables %.1f MiB", s.ID,
			float64(s.ResidentBytes)/(1<<20), float64(s.CgroupBytes)/(1<<20), float64(s.CgroupLimitBytes)/(1<<20), float64(s.MemoryBytes)/(1<<20))
		assert.Positive(t, s.CgroupBytes, s.ID)
		assert.LessOrEqual(t, s.CgroupBytes, s.CgroupLimitBytes, s.ID)
		if s.ID == id {
			assert.Equal(t, int64(oomLimit*3/2), s.CgroupLimitBytes, "%s: its replacement pod's memory limit", s.ID)
			continue
		}
		// The other server is killed in its turn should it outgrow oomLimit before this reading.
		assert.Contains(t, []int64{oomLimit, oomLimit * 3 / 2}, s.CgroupLimitBytes, "%s: its pod's memory limit", s.ID)
	}

	done, err := waitJob(ctx, cp, ns, job)
	require.NoError(t, err, logs())
	require.Equal(t, int32(1), done.Status.Succeeded, "the Job succeeded\n%s", logs())
	out := node.Logs(ns, coord.Name)
	assert.Contains(t, out, "every position of every epoch covered exactly once", out)
	assert.Contains(t, out, fmt.Sprintf("autoscale: restart-server %s: was killed for lack of memory at a limit of %.2f GiB", id, float64(oomLimit)/(1<<30)), out)
	assert.Contains(t, out, fmt.Sprintf("pod %s OOMKilled: exit code 137, memory limit %s", killed.Name, killedLimit.String()), out)
	assert.NotContains(t, out, "restarted with", "the autoscaler restarted no server itself: the scaler's replacement was as large as it asked")
}

// awaitUsage returns the job's Usage once every server's counters were read.
func awaitUsage(t *testing.T, ctx context.Context, ctl *remote.Control) elastic.Status {
	t.Helper()
	for {
		u, err := ctl.Usage(ctx)
		if err == nil && len(u.Servers) > 0 && !slices.ContainsFunc(u.Servers, func(s elastic.ServerStatus) bool { return s.UsageError != "" || s.Pid == 0 }) {
			return u
		}
		require.NoError(t, wait.Sleep(ctx, statusEvery), "waiting for every server's usage (last: %v)", err)
	}
}

// oomKilled says a pod's container was killed for going over its memory limit.
func oomKilled(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool {
		return c.State.Terminated != nil && c.State.Terminated.Reason == "OOMKilled"
	})
}
