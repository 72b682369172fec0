package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
)

// defaultPath is the PATH of a pod's process, a container image's usual one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// podWorker runs one pod (one UID) of a node. Its goroutine owns the pod's processes, files and
// cgroup, and writes the pod's status; the informer's handler tells it of each change of the pod.
type podWorker struct {
	n         *Node
	uid       types.UID
	namespace string
	name      string
	dir       string        // the pod's files: home/, volumes/, resolv.conf
	logPath   string        // its container's output, kept until the node stops
	wakeCh    chan struct{} // holds one token when the pod changed

	mu   sync.Mutex  // guards what follows
	pod  *corev1.Pod // as last seen
	gone bool        // removed from the API
	pid  int         // of the running process, 0 if none
	cg   *podCgroup  // nil before the first start and once removed

	// Owned by the goroutine.
	view    podView
	ran     bool                    // the container has been started at least once
	sources map[string]volumeSource // by volume name; nil until prepareVolumes succeeds
	tmpfs   []string                // the volume directories it has mounted a tmpfs on
}

func newPodWorker(n *Node, pod *corev1.Pod) *podWorker {
	return &podWorker{
		n:         n,
		uid:       pod.UID,
		namespace: pod.Namespace,
		name:      pod.Name,
		dir:       filepath.Join(n.dir, "pods", string(pod.UID)),
		logPath:   filepath.Join(n.dir, "logs", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)+".log"),
		wakeCh:    make(chan struct{}, 1),
		pod:       pod,
	}
}

// update records the pod as the informer now sees it, or its removal, and wakes the goroutine.
func (w *podWorker) update(pod *corev1.Pod, deleted bool) {
	w.mu.Lock()
	w.pod = pod
	w.gone = w.gone || deleted
	w.mu.Unlock()
	w.wake()
}

func (w *podWorker) wake() {
	select {
	case w.wakeCh <- struct{}{}:
	default:
	}
}

func (w *podWorker) latest() (*corev1.Pod, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod, w.gone
}

func (w *podWorker) setPid(pid int) {
	w.mu.Lock()
	w.pid = pid
	w.mu.Unlock()
}

func (w *podWorker) setCgroup(cg *podCgroup) {
	w.mu.Lock()
	w.cg = cg
	w.mu.Unlock()
}

func (w *podWorker) run(ctx context.Context) {
	defer w.n.wg.Done()
	defer w.n.forget(w)
	defer w.cleanup()
	select {
	case <-w.n.synced:
	case <-ctx.Done():
		return
	}
	if err := os.MkdirAll(filepath.Join(w.dir, "home"), 0o755); err != nil {
		w.n.log.Error("pod directory", "pod", w.key(), "err", err)
		return
	}
	w.live(ctx)
}

func (w *podWorker) key() string { return w.namespace + "/" + w.name }

// live runs the pod's container, restarting it as its policy says, until the pod is gone or
// the agent stops.
func (w *podWorker) live(ctx context.Context) {
	b := backoff{base: w.n.opts.RestartBackoff, limit: 10 * w.n.opts.RestartBackoff}
	for {
		pod, run, ok := w.admit(ctx)
		if !ok {
			return
		}
		p, rd := w.start(ctx, pod, run)
		end := w.supervise(ctx, p, rd)
		w.setPid(0)
		if end == endStopped || end == endRemoved {
			return
		}
		term := w.terminated(p)
		w.view.exited(pod, term)
		w.n.log.Info("pod container ended", "pod", w.key(), "exitCode", term.ExitCode, "reason", term.Reason)
		pod, _ = w.latest()
		if end == endDeleting || !restarts(pod.Spec.RestartPolicy, term.ExitCode) {
			w.finish(ctx)
			w.awaitRemoval(ctx)
			return
		}
		delay := b.next(p.finished.Sub(p.started.Time))
		w.view.crashLoop(pod, delay)
		w.writeStatus(ctx)
		if !w.backOff(ctx, delay) {
			return
		}
		w.view.container.RestartCount++
	}
}

// admit waits until the pod's container may start and returns what the start needs, or false
// once the pod's life on this node has ended: it is gone, refused for good, deleted before it
// could start, or the agent stops.
func (w *podWorker) admit(ctx context.Context) (*corev1.Pod, *containerRun, bool) {
	var shown *refusal
	retryTimer := time.NewTimer(time.Hour)
	retryTimer.Stop()
	defer retryTimer.Stop()
	for {
		pod, gone := w.latest()
		if gone {
			return nil, nil, false
		}
		if pod.DeletionTimestamp != nil {
			if w.ran {
				w.finish(ctx)
			}
			w.awaitRemoval(ctx)
			return nil, nil, false
		}
		if !w.ran && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed) {
			w.awaitRemoval(ctx) // it ended before this agent saw it
			return nil, nil, false
		}
		run, r := w.prepare(ctx, pod)
		if r == nil {
			return pod, run, true
		}
		if r.final {
			w.n.log.Warn("pod refused", "pod", w.key(), "reason", r.reason, "message", r.message)
			w.removeCgroup()
			w.unmountVolumes()
			w.view.refused(r)
			w.writeStatus(ctx)
			w.awaitRemoval(ctx)
			return nil, nil, false
		}
		if shown == nil || *shown != *r {
			w.n.log.Info("pod waits", "pod", w.key(), "reason", r.reason, "message", r.message)
			w.view.waiting(pod, r, w.ran)
			w.writeStatus(ctx)
			shown = r
		}
		if r.retry {
			retryTimer.Reset(retryEvery)
		}
		select {
		case <-ctx.Done():
			return nil, nil, false
		case <-w.wakeCh:
		case <-retryTimer.C:
		}
		retryTimer.Stop()
	}
}

// prepare checks the pod and resolves what its container's start needs.
func (w *podWorker) prepare(ctx context.Context, pod *corev1.Pod) (*containerRun, *refusal) {
	n := w.n
	if r := checkShape(pod); r != nil {
		return nil, r
	}
	if r := checkVolumes(pod); r != nil {
		return nil, r
	}
	c := &pod.Spec.Containers[0]
	binary, ok := n.opts.Images[c.Image]
	if !ok {
		return nil, &refusal{reason: "ErrImageNeverPull", message: fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)}
	}
	if r := n.checkMounts(pod, c, binary); r != nil {
		return nil, r
	}
	if r := n.checkAddress(pod); r != nil {
		return nil, r
	}
	if w.sources == nil {
		if r := w.prepareVolumes(ctx, pod); r != nil {
			return nil, r
		}
	}
	env, r := containerEnv(ctx, apiObjects{n.cp}, pod, c, n.service, n.opts.Capacity)
	if r != nil {
		return nil, r
	}
	home := filepath.Join(w.dir, "home")
	var penv envList
	penv.set("PATH", defaultPath)
	penv.set("HOME", home)
	penv.set("HOSTNAME", podHostname(pod))
	for _, v := range env.vars {
		penv.set(v.name, v.value)
	}
	etc := []bindMount{{src: n.hosts.path, dst: n.etcHosts, file: true, create: n.inRun(n.etcHosts)}}
	if n.etcRes != "" {
		resolv := filepath.Join(w.dir, "resolv.conf")
		text := "# Written by the kubetest node agent: there is no cluster DNS, names are in /etc/hosts.\n" +
			"nameserver 127.0.0.1\n" +
			"search " + pod.Namespace + ".svc." + clusterDomain + " svc." + clusterDomain + " " + clusterDomain + "\n"
		if err := os.WriteFile(resolv, []byte(text), 0o644); err != nil {
			return nil, &refusal{retry: true, reason: "ContainerCreating", message: err.Error()}
		}
		etc = append(etc, bindMount{src: resolv, dst: n.etcRes, file: true, create: n.inRun(n.etcRes)})
	}
	mounts, r := n.planMounts(c, w.sources, binary, etc)
	if r != nil {
		return nil, r
	}
	workDir := c.WorkingDir
	if workDir == "" {
		workDir = home
	}
	return &containerRun{
		binary:  binary,
		args:    commandLine(c, env),
		env:     penv.environ(),
		mounts:  mounts,
		workDir: workDir,
	}, nil
}

// inRun reports whether path lies under a directory that a pod's tmpfs covers.
func (n *Node) inRun(path string) bool {
	for _, d := range n.runDirs {
		if _, ok := under(path, d); ok {
			return true
		}
	}
	return false
}

// checkAddress refuses a pod whose address another live pod holds: for good if the other has
// another name that hashes to the same address, for the time being if it is an older pod of
// the same name. A live pod holds its address before pod does if it has it in its status and
// pod has not, or was created first. (Two such pods created at the same moment on two nodes
// may both run.)
func (n *Node) checkAddress(pod *corev1.Pod) *refusal {
	ip := PodIP(pod.Namespace, pod.Name)
	for _, obj := range n.pods.List() {
		o, ok := obj.(*corev1.Pod)
		if !ok || o.UID == pod.UID || o.Status.Phase == corev1.PodSucceeded || o.Status.Phase == corev1.PodFailed || !holdsFirst(o, pod) {
			continue
		}
		if o.Namespace == pod.Namespace && o.Name == pod.Name {
			return &refusal{reason: "ContainerCreating", message: fmt.Sprintf("waiting for the previous pod %s/%s (uid %s) to end: it holds address %s", o.Namespace, o.Name, o.UID, ip)}
		}
		if PodIP(o.Namespace, o.Name) == ip {
			return &refusal{final: true, reason: ReasonPodIPCollision, message: fmt.Sprintf("pod %s/%s, created first, has the same address %s: kubetest.PodIP hashes both names to it; rename one", o.Namespace, o.Name, ip)}
		}
	}
	return nil
}

// holdsFirst reports whether pod a has the first claim to an address it shares with pod b: it
// has the address in its status and b has not, or neither or both have and a was created first.
func holdsFirst(a, b *corev1.Pod) bool {
	if (a.Status.PodIP != "") != (b.Status.PodIP != "") {
		return a.Status.PodIP != ""
	}
	return createdBefore(a, b)
}

// createdBefore orders pods by creation, then by namespace, name and UID.
func createdBefore(a, b *corev1.Pod) bool {
	ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	ka := a.Namespace + "/" + a.Name + "/" + string(a.UID)
	kb := b.Namespace + "/" + b.Name + "/" + string(b.UID)
	return ka < kb
}

// start makes the pod's cgroup if it has none, starts its container, and reports it running,
// and ready unless it has a readiness probe, which it returns.
func (w *podWorker) start(ctx context.Context, pod *corev1.Pod, run *containerRun) (*podProcess, *readiness) {
	w.ran = true
	if w.cg == nil {
		cg, err := w.n.cg.create("kubetest-"+w.n.name+"-"+string(w.uid), pod.Spec.Containers[0].Resources.Limits)
		if err != nil {
			p := &podProcess{started: metav1.Now(), finished: metav1.Now(), startErr: err.Error(), done: make(chan struct{})}
			close(p.done)
			return p, nil
		}
		w.setCgroup(cg)
	}
	var procs []string
	for _, d := range w.cg.dirs() {
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
	}
	var tmpfs []string
	for _, d := range w.n.runDirs {
		if !slices.Contains(tmpfs, d) {
			tmpfs = append(tmpfs, d)
		}
	}
	slices.Sort(tmpfs)
	script := startScript{
		cgroupProcs: procs,
		hostname:    podHostname(pod),
		tmpfs:       tmpfs,
		mounts:      run.mounts,
		workDir:     run.workDir,
		mount:       w.n.mountBin,
		mkdir:       w.n.mkdirBin,
	}
	p := startPodProcess(ctx, run, script, w.logPath, w.dir, w.cg)
	if p.startErr != "" {
		w.n.log.Warn("pod container did not start", "pod", w.key(), "err", p.startErr)
		return p, nil
	}
	w.setPid(p.pid)
	w.n.log.Info("pod container started", "pod", w.key(), "pid", p.pid)
	rd, err := newReadiness(&pod.Spec.Containers[0], PodIP(w.namespace, w.name))
	if err != nil {
		w.n.log.Warn("pod readiness probe", "pod", w.key(), "err", err)
	}
	w.view.running(pod, p, run.binary, rd == nil)
	w.writeStatus(ctx)
	return p, rd
}

// ending is how supervise saw a process end.
type ending int

const (
	endExited   ending = iota // by itself, or killed by another
	endDeleting               // stopped because the pod is being deleted
	endRemoved                // the pod is gone from the API; no status to write
	endStopped                // the agent stops
)

// supervise waits for p to end, and runs its readiness probe rd, if any, meanwhile. A deletion
// of the pod sends SIGTERM to p's group and SIGKILL once the grace period has passed (a later
// deletion may shorten it); the pod's removal from the API does the same with the grace of its
// last state; the agent's stop sends SIGKILL at once. Whatever p leaves in its group when it
// ends is killed.
func (w *podWorker) supervise(ctx context.Context, p *podProcess, rd *readiness) ending {
	defer signalGroupIfRan(p)
	var results chan bool
	var tracker readyTracker
	if rd != nil {
		probeCtx, cancel := context.WithCancel(ctx)
		results = make(chan bool)
		probeDone := make(chan struct{})
		go func() {
			defer close(probeDone)
			rd.run(probeCtx, results)
		}()
		defer func() {
			cancel()
			<-probeDone
		}()
		tracker = newReadyTracker(rd.probe)
	}
	end := endExited
	var termAt, deadline time.Time
	kill := time.NewTimer(time.Hour)
	kill.Stop()
	defer kill.Stop()
	for {
		select {
		case ok := <-results:
			ready := tracker.add(ok, w.view.container.Ready)
			if ready != w.view.container.Ready && termAt.IsZero() {
				w.view.container.Ready = ready
				w.writeStatus(ctx)
			}
		case <-p.done:
			return end
		case <-ctx.Done():
			p.signal(syscall.SIGKILL)
			<-p.done
			return endStopped
		case <-kill.C:
			w.n.log.Info("pod grace period over: SIGKILL", "pod", w.key())
			p.signal(syscall.SIGKILL)
		case <-w.wakeCh:
			pod, gone := w.latest()
			switch {
			case gone:
				end = endRemoved
			case pod.DeletionTimestamp != nil:
				end = endDeleting
			default:
				continue
			}
			grace := gracePeriod(pod.DeletionGracePeriodSeconds, pod.Spec.TerminationGracePeriodSeconds)
			if termAt.IsZero() {
				termAt = time.Now()
				if grace > 0 {
					w.n.log.Info("pod deleted: SIGTERM", "pod", w.key(), "grace", grace)
					p.signal(syscall.SIGTERM)
				}
			}
			if d := termAt.Add(grace); deadline.IsZero() || d.Before(deadline) {
				deadline = d
				kill.Stop()
				kill.Reset(time.Until(d))
			}
		}
	}
}

// signalGroupIfRan kills what p left in its process group once it has ended.
func signalGroupIfRan(p *podProcess) {
	if p.pid != 0 {
		signalGroup(p.pid, syscall.SIGKILL)
	}
}

// terminated returns the container state of p's end: OOMKilled when the kernel killed it for
// memory (SIGKILL, and the cgroup's OOM kill count rose), Completed for exit 0, Error otherwise,
// StartError when it never ran; the exit code is the status, or 128 plus the signal.
func (w *podWorker) terminated(p *podProcess) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{StartedAt: p.started, FinishedAt: p.finished, ContainerID: p.containerID()}
	if p.startErr != "" {
		t.ExitCode, t.Reason, t.Message = 128, "StartError", p.startErr
		return t
	}
	if sig := exitSignal(p.state); sig != 0 {
		t.Signal = int32(sig)
		t.ExitCode = 128 + int32(sig)
	} else {
		t.ExitCode = int32(p.state.ExitCode())
	}
	w.mu.Lock()
	cg := w.cg
	w.mu.Unlock()
	switch {
	case t.Signal == int32(syscall.SIGKILL) && cg != nil && cg.oomKills() > p.oomBefore:
		t.Reason = "OOMKilled"
	case t.ExitCode == 0:
		t.Reason = "Completed"
	default:
		t.Reason = "Error"
	}
	return t
}

// restarts reports whether a container that exited with code restarts under policy.
func restarts(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default:
		return true
	}
}

// backoff is the delay before a container's restarts.
type backoff struct {
	base, limit, cur time.Duration
}

// next returns the delay before the next restart of a container that ran for ran.
func (b *backoff) next(ran time.Duration) time.Duration {
	if b.cur == 0 || ran > 2*b.limit {
		b.cur = b.base
	}
	d := b.cur
	b.cur = min(2*b.cur, b.limit)
	return d
}

// backOff waits delay before a restart and reports whether to restart: not if the pod is gone
// or deleted meanwhile (then it ends the pod) or the agent stops.
func (w *podWorker) backOff(ctx context.Context, delay time.Duration) bool {
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-w.wakeCh:
			pod, gone := w.latest()
			if gone {
				return false
			}
			if pod.DeletionTimestamp != nil {
				w.finish(ctx)
				w.awaitRemoval(ctx)
				return false
			}
		}
	}
}

// finish ends the pod after its container's last exit: its cgroup and the tmpfs of its Memory
// emptyDirs go, and its status becomes terminal, Succeeded if the container exited 0, Failed
// otherwise.
func (w *podWorker) finish(ctx context.Context) {
	w.removeCgroup()
	w.unmountVolumes()
	w.view.terminal()
	w.writeStatus(ctx)
}

func (w *podWorker) removeCgroup() {
	w.mu.Lock()
	cg := w.cg
	w.mu.Unlock()
	if cg == nil {
		return
	}
	if err := cg.remove(context.Background()); err != nil {
		w.n.log.Error("pod cgroup", "pod", w.key(), "err", err)
	}
	w.setCgroup(nil)
}

// awaitRemoval waits until the pod is gone from the API, and once it is being deleted, removes
// it (grace 0, on condition of its UID), as a kubelet does once the pod's containers are gone.
func (w *podWorker) awaitRemoval(ctx context.Context) {
	requested := false
	retryTimer := time.NewTimer(time.Hour)
	retryTimer.Stop()
	defer retryTimer.Stop()
	for {
		pod, gone := w.latest()
		if gone {
			return
		}
		if pod.DeletionTimestamp != nil && !requested {
			if err := w.deleteFromAPI(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				w.n.log.Error("pod removal", "pod", w.key(), "err", err)
				retryTimer.Reset(retryEvery)
			} else {
				requested = true
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wakeCh:
		case <-retryTimer.C:
		}
	}
}

func (w *podWorker) deleteFromAPI(ctx context.Context) error {
	zero := int64(0)
	uid := w.uid
	err := w.n.cp.Client.CoreV1().Pods(w.namespace).Delete(ctx, w.name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // a conflict: the name is another pod's now, so this one is gone
	}
	return err
}

// writeStatus writes the view into the pod's status, reading the pod again on a conflict.
func (w *podWorker) writeStatus(ctx context.Context) {
	pods := w.n.cp.Client.CoreV1().Pods(w.namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != w.uid {
			return nil
		}
		w.view.apply(&cur.Status, w.namespace, w.name, metav1.Now())
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		w.n.log.Error("pod status", "pod", w.key(), "err", err)
	}
}

// cleanup removes what the pod leaves on the machine: its cgroup, the tmpfs of its Memory
// emptyDirs and its files (not its log).
func (w *podWorker) cleanup() {
	w.removeCgroup()
	w.unmountVolumes()
	if err := os.RemoveAll(w.dir); err != nil {
		w.n.log.Error("pod files", "pod", w.key(), "err", err)
	}
}
