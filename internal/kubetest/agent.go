package kubetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// ErrInvalidConfig is returned by RunNode for NodeOptions that cannot work, and by
// CreateHostPathVolume for a HostPathVolume that cannot; the message lists every problem.
var ErrInvalidConfig = errors.New("kubetest: invalid config")

// ErrNodeUnsupported is returned by RunNode where a node agent cannot run pods: not Linux, not
// root, no /usr/bin/unshare, or no writable cgroup hierarchy of the memory and cpu controllers.
// StartNode skips the test then, or fails it when the environment says CI=true.
var ErrNodeUnsupported = errors.New("kubetest: node agent unsupported here")

// NodeOptions configure a node agent (RunNode). The zero value is a node with no capacity that
// knows no image.
type NodeOptions struct {
	// Capacity is the node's capacity and allocatable resources, as AddNode's. A container's
	// resourceFieldRef to a limit it does not set reads the node's capacity, as a kubelet's
	// reads its allocatable resources.
	Capacity corev1.ResourceList

	// Images maps a container image to the local binary that is its entrypoint. A pod whose
	// image is not here stays Pending with its container waiting as ErrImageNeverPull, as on a
	// kubelet with imagePullPolicy Never. Each binary must exist and be executable.
	Images map[string]string

	// RestartBackoff is how long a pod of restartPolicy Always or OnFailure waits before its
	// first restart; each restart doubles it, up to 10 times RestartBackoff, and a run longer
	// than twice that resets it. Zero means 1 s (a kubelet waits 10 s, up to 5 minutes).
	RestartBackoff time.Duration

	// Logger receives the agent's log: pods started, ended, refused. Nil discards it.
	Logger *slog.Logger
}

// defaultRestartBackoff is the first restart's delay when NodeOptions leave it unset.
const defaultRestartBackoff = time.Second

// retryEvery is how often the agent tries again a container it could not start for a missing
// Secret, ConfigMap or token, and a failed deletion.
const retryEvery = time.Second

// withDefaults checks o, and returns it with defaults set and the binaries as absolute paths.
func (o NodeOptions) withDefaults() (NodeOptions, error) {
	var errs []error
	if o.RestartBackoff < 0 {
		errs = append(errs, fmt.Errorf("RestartBackoff %v is negative", o.RestartBackoff))
	}
	if o.RestartBackoff == 0 {
		o.RestartBackoff = defaultRestartBackoff
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	images := make(map[string]string, len(o.Images))
	for image, bin := range o.Images {
		abs, err := filepath.Abs(bin)
		if err == nil {
			var fi os.FileInfo
			fi, err = os.Stat(abs)
			if err == nil && (!fi.Mode().IsRegular() || fi.Mode()&0o111 == 0) {
				err = errors.New("not an executable file")
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("image %q: binary %s: %v", image, bin, err))
		}
		images[image] = abs
	}
	o.Images = images
	if len(errs) > 0 {
		return o, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return o, nil
}

// Node is a node agent: it runs the pods the scheduler binds to its node as local processes, as
// a kubelet would run them in containers. See RunNode for how, and for what it does not do.
//
// Its methods are safe for concurrent use. Stop is idempotent.
type Node struct {
	cp   *ControlPlane
	name string
	opts NodeOptions
	log  *slog.Logger

	// Set by RunNode and not changed after.
	dir      string            // the node's files, removed by Stop: hosts, pods/UID/, logs/
	cg       cgroups           // where pods' cgroups go
	runDirs  map[string]string // "/run" and "/var/run" to their real directories, each covered by a pod's tmpfs
	hosts    *hostsFile        // used only by the informer's handler goroutine
	etcHosts string            // the real path of /etc/hosts, which a pod's mount covers
	etcRes   string            // the real path of /etc/resolv.conf, "" if none
	mountBin string
	mkdirBin string
	service  *envList        // the kubernetes Service's variables
	pods     cache.Store     // every pod of the cluster, as the informer last saw it
	synced   chan struct{}   // closed once the informer has delivered the first list
	ctx      context.Context // the agent's lifetime: Stop cancels it
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the informer and each pod's goroutine
	stopOnce sync.Once

	// mu guards what follows. It is taken before a podWorker's mu, never after.
	mu       sync.Mutex
	stopping bool
	workers  map[types.UID]*podWorker // pods this agent runs or will, by UID
	named    map[string]*podWorker    // "namespace/name" to the latest worker of that name, kept after its pod is gone, for Logs
}

// RunNode registers node name with AddNode and runs an agent for it until Stop, whatever
// happens to ctx after RunNode returns; ctx bounds the registration and the first list of pods.
// An error wraps ErrInvalidConfig for bad options and ErrNodeUnsupported where pods cannot run.
//
// The agent watches every pod of the cluster (one informer, which reconnects by itself) and
// runs those bound to its node much as a kubelet would, with these differences:
//
//   - A pod has one container and no init or ephemeral containers, else it fails with reason
//     Unsupported. Its image is a local binary (NodeOptions.Images), whatever the pull policy;
//     it runs as this process's user (root), with no image filesystem, and the pod's security
//     context, termination message path and enableServiceLinks are ignored.
//   - The process runs in mount and UTS namespaces of its own, and nothing else of a
//     container's: it shares the machine's network, pids and files. Its host name is the pod's
//     (spec.hostname, else its name). Its address, PodIP, is one of 127.0.0.0/8 that its
//     programs must bind themselves; status.podIP and the fieldRef status.podIP give it.
//   - Names: each agent keeps one hosts file, which its pods see as /etc/hosts. It maps
//     hostname.subdomain.namespace.svc.cluster.local and hostname.subdomain.namespace.svc of every
//     pod of the cluster with spec.hostname and spec.subdomain to its PodIP, from the moment the
//     pod exists (running or not) until it is gone, and the host name of each pod of this node to
//     its PodIP, where a kubelet writes only the pod's own. There is no cluster DNS, no Service
//     address and no search domain at work. The file is rewritten in place as pods come and go,
//     but Go's resolver reads /etc/hosts at most every 5 s, so a program that looked a name up
//     before it was written may not find it for that long. Where /etc/resolv.conf exists, a pod
//     sees its own, whose only server is 127.0.0.1: a name missing from the hosts file fails
//     fast instead of reaching the machine's resolver.
//   - The environment holds PATH, HOME (a directory of the pod's, which is also its default
//     working directory) and HOSTNAME, then the kubernetes Service's variables
//     (KUBERNETES_SERVICE_HOST=127.0.0.1 and KUBERNETES_SERVICE_PORT, the apiserver's port, and
//     the like) but no other Service's, then the container's envFrom and env, resolved as a
//     kubelet does. $(VAR) in command and args is expanded as a kubelet does. Command[0] names
//     the image's entrypoint and is not run: the binary gets Command[1:] and Args.
//   - Volumes: emptyDir is a directory of the pod's that lasts until the pod ends; of medium
//     Memory it is a tmpfs, sized as a kubelet sizes it (the node's memory capacity, or the
//     container's memory limit if lower, or the sizeLimit if lower still), whose pages count
//     against the pod's memory limit and are freed once the pod has ended; of the default
//     medium its sizeLimit is ignored. hostPath
//     of type "", Directory, DirectoryOrCreate, File or FileOrCreate is checked and made as a
//     kubelet does (a missing path of no type is made a directory, as a container runtime
//     does); other types fail the pod. persistentVolumeClaim: the container waits while the
//     claim is missing or not Bound (the scheduler does not place a pod whose claim is unbound,
//     but a pod created with spec.nodeName comes straight to the agent), then the directory of
//     the claim's PersistentVolume, of type hostPath (checked as above) or local (an existing
//     directory), is mounted; a PersistentVolume of another type, or of volumeMode Block, fails
//     the pod. Binding is the controller manager's: see CreateHostPathVolume. secret,
//     configMap, downwardAPI and projected (serviceAccountToken, secret, configMap,
//     downwardAPI) are written once before the first start and do not follow later changes; a
//     token is not renewed. The ServiceAccount admission plugin gives each pod that automounts
//     a token a projected volume at /var/run/secrets/kubernetes.io/serviceaccount, whose token
//     the agent requests bound to the pod; the ConfigMap kube-root-ca.crt it names, which the
//     controller manager would publish, is served from the control plane's CA when absent. So
//     rest.InClusterConfig works in the pod. Any other volume type fails the pod.
//   - Mounts are bind mounts in the pod's mount namespace. Each pod gets an empty tmpfs over
//     /run (and so /var/run), where a mount may go anywhere, its directory or file made;
//     elsewhere a mount covers an existing directory (or file, for a file) for that pod only,
//     such as /mnt or /dev/shm (a Memory emptyDir there is the pod's own shared memory, as on
//     a kubelet, and the machine's /dev/shm is untouched). A mount may not cover /, /etc, /proc,
//     /sys or /dev or what lies under the last three (but /dev/shm), nor hide the pod's binary
//     or the node's files (so not /tmp when they are there). A volume's source (a hostPath, a
//     PersistentVolume's path) may not lie under /run or under the path of another mount of
//     the pod. A mount is read-only if its volumeMount or its claim says readOnly. subPath and
//     mountPropagation are not supported. A container waits as ContainerCreating while a
//     volume's source is missing, and as CreateContainerConfigError while an env source is;
//     the agent retries every second.
//   - Resources: limits.memory and limits.cpu become the memory limit and CPU quota of a cgroup
//     of the pod (cgroup v1 or v2, whichever the machine mounts), kubetest-NODE-UID under this
//     process's own cgroup; requests are not enforced. A process the kernel kills for memory
//     ends OOMKilled. Should the test binary die, the kernel kills the pods' processes (their
//     parent-death signal), but their empty cgroups and the node's files stay behind, and
//     with them the tmpfs of Memory emptyDirs, which the agent mounts among the pod's files,
//     in this process's mount namespace, so that they outlive the container's restarts.
//   - Probes: tcpSocket and httpGet (plain HTTP) readiness probes run as a kubelet runs them; a
//     container with none, or with an exec or gRPC one, is ready once it runs. Liveness and
//     startup probes are not run.
//   - Restarts: restartPolicy Always and OnFailure restart the container in the same pod and
//     cgroup after NodeOptions.RestartBackoff, doubling (a kubelet restarts at once the first
//     time, then after 10 s, doubling to 5 minutes).
//   - Deletion: SIGTERM to the process's group, SIGKILL when the grace period ends (a kubelet
//     waits at least 2 s), then the final status, and the removal of the pod with grace 0 on
//     condition of its UID, as a kubelet does. A pod that never ran, or had ended, is removed at
//     once. A pod removed outright (grace 0, force) has its process killed.
//   - A pod recreated under the name of a pod that has not ended waits, as ContainerCreating,
//     until that one has: both have one address. Two names that PodIP maps to one address fail
//     the later pod with reason PodIPCollision.
//   - The agent writes pod status, and no Events, Leases or node heartbeats: the Node stays
//     Ready, even after Stop.
func (cp *ControlPlane) RunNode(ctx context.Context, name string, opts NodeOptions) (*Node, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := agentSupported(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNodeUnsupported, err)
	}
	cg, err := detectCgroups()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNodeUnsupported, err)
	}
	u, err := url.Parse(cp.URL)
	if err != nil {
		return nil, fmt.Errorf("kubetest: apiserver URL: %w", err)
	}
	n := &Node{
		cp: cp, name: name, opts: opts, log: opts.Logger.With("node", name),
		cg:      cg,
		runDirs: make(map[string]string),
		service: serviceEnv(u.Port()),
		synced:  make(chan struct{}),
		workers: make(map[types.UID]*podWorker),
		named:   make(map[string]*podWorker),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if err := n.setUp(ctx); err != nil {
		n.Stop()
		return nil, fmt.Errorf("kubetest: node %s: %w", name, err)
	}
	return n, nil
}

// setUp prepares the node's files, registers it, and starts the informer.
func (n *Node) setUp(ctx context.Context) error {
	var err error
	for _, tool := range []struct {
		name string
		dst  *string
	}{{"mount", &n.mountBin}, {"mkdir", &n.mkdirBin}} {
		if *tool.dst, err = findTool(tool.name); err != nil {
			return fmt.Errorf("%w: %v", ErrNodeUnsupported, err)
		}
	}
	for _, alias := range []string{"/run", "/var/run"} {
		if real, err := filepath.EvalSymlinks(alias); err == nil {
			n.runDirs[alias] = real
		}
	}
	if n.etcHosts, err = filepath.EvalSymlinks("/etc/hosts"); err != nil {
		return fmt.Errorf("%w: no /etc/hosts to mount a pod's over: %v", ErrNodeUnsupported, err)
	}
	n.etcRes, _ = filepath.EvalSymlinks("/etc/resolv.conf") // none: pods use the resolver's defaults

	if n.dir, err = os.MkdirTemp("", "kubetest-node-"); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(n.dir)
	if err != nil {
		return err
	}
	for alias, run := range n.runDirs {
		if _, ok := under(real, run); ok {
			return fmt.Errorf("%w: the temporary directory %s lies under %s, which each pod's tmpfs covers; set TMPDIR elsewhere", ErrNodeUnsupported, n.dir, alias)
		}
	}
	for _, d := range []string{"pods", "logs"} {
		if err := os.Mkdir(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	if n.hosts, err = newHostsFile(filepath.Join(n.dir, "hosts"), n.name); err != nil {
		return err
	}

	if err := n.cp.AddNode(ctx, n.name, n.opts.Capacity); err != nil {
		return err
	}
	lw := cache.NewListWatchFromClient(n.cp.Client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.podEvent(obj, false) },
		UpdateFunc: func(_, obj any) { n.podEvent(obj, false) },
		DeleteFunc: func(obj any) { n.podEvent(obj, true) },
	})
	if err != nil {
		return err
	}
	n.pods = inf.GetStore()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		inf.RunWithContext(n.ctx)
	}()
	select {
	case <-reg.HasSyncedChecker().Done():
	case <-ctx.Done():
		return fmt.Errorf("list pods: %w", ctx.Err())
	}
	close(n.synced)
	n.log.Info("node agent runs", "dir", n.dir)
	return nil
}

// findTool returns the path of a system program in the usual directories.
func findTool(name string) (string, error) {
	for _, dir := range []string{"/usr/bin", "/bin", "/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("no %s in /usr/bin, /bin, /usr/sbin or /sbin", name)
}

// StartNode runs a node agent for test t, as RunNode, and fails t if it cannot start (or skips
// it, unless the environment says CI=true, where pods cannot run: see ErrNodeUnsupported). When
// t ends it logs every pod's output if t failed, stops the agent and deletes the Node, so that
// no later test's pod is bound to a node with no agent.
func (cp *ControlPlane) StartNode(t testing.TB, name string, opts NodeOptions) *Node {
	t.Helper()
	n, err := cp.RunNode(t.Context(), name, opts)
	if err != nil {
		if errors.Is(err, ErrNodeUnsupported) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(n.dump())
		}
		n.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Logf("kubetest: delete node %s: %v", name, err)
		}
	})
	return n
}

// dumpTailBytes is how much of each pod's output a failed test shows.
const dumpTailBytes = 16 << 10

// dump returns the tail of every pod's output, each under a header.
func (n *Node) dump() string {
	n.mu.Lock()
	keys := make([]string, 0, len(n.named))
	for k := range n.named {
		keys = append(keys, k)
	}
	n.mu.Unlock()
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "kubetest: node %s ran %d pods", n.name, len(keys))
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		out := n.Logs(ns, name)
		if len(out) > dumpTailBytes {
			out = "[...]" + out[len(out)-dumpTailBytes:]
		}
		fmt.Fprintf(&b, "\n--- pod %s, its output:\n%s", k, out)
	}
	return b.String()
}

// Stop kills every process the agent runs (SIGKILL, with no status written), waits for them,
// and removes their cgroups and the node's files. It leaves the Node object and the pods in the
// API as they are. It is idempotent.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		n.mu.Lock()
		n.stopping = true
		n.mu.Unlock()
		n.cancel()
		n.wg.Wait()
		if n.dir != "" {
			_ = os.RemoveAll(n.dir)
		}
		n.log.Info("node agent stopped")
	})
}

// Logs returns the output (stdout and stderr) of pod namespace/name so far, of every start of
// its container, or "" if this node has run no pod of that name. Of pods recreated under one
// name it is the latest's. It serves failure messages, and works until Stop.
func (n *Node) Logs(namespace, pod string) string {
	w := n.worker(namespace, pod)
	if w == nil {
		return ""
	}
	b, err := os.ReadFile(w.logPath)
	if err != nil {
		return ""
	}
	return string(b)
}

// Pid returns the pid of the running process of pod namespace/name, or 0 if none runs. A test
// kills it to crash the pod.
func (n *Node) Pid(namespace, pod string) int {
	w := n.worker(namespace, pod)
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pid
}

// CgroupDir returns the directory of pod namespace/name's cgroup for controller "memory" or
// "cpu" (under cgroup v2 both are the pod's one cgroup), or "" if the pod has none now: before
// its first start and after its process ended for good.
func (n *Node) CgroupDir(namespace, pod, controller string) string {
	w := n.worker(namespace, pod)
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cg == nil {
		return ""
	}
	switch controller {
	case "memory":
		return w.cg.memory
	case "cpu":
		return w.cg.cpu
	}
	return ""
}

func (n *Node) worker(namespace, pod string) *podWorker {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.named[namespace+"/"+pod]
}

// podEvent handles the informer's news of a pod: the hosts file follows every pod, and a
// pod of this node goes to its worker.
func (n *Node) podEvent(obj any, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		d, ok := obj.(cache.DeletedFinalStateUnknown)
		if !ok {
			return
		}
		if pod, ok = d.Obj.(*corev1.Pod); !ok {
			return
		}
	}
	line := ""
	if !deleted {
		line = hostsLine(pod, pod.Spec.NodeName == n.name)
	}
	if err := n.hosts.set(pod.Namespace+"/"+pod.Name+"/"+string(pod.UID), line); err != nil {
		n.log.Error("hosts file", "err", err)
	}
	n.dispatch(pod, deleted)
}

func (n *Node) dispatch(pod *corev1.Pod, deleted bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopping {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	// A pod recreated under this name may be waiting for this one to end.
	if w := n.named[key]; w != nil && w.uid != pod.UID {
		w.wake()
	}
	if pod.Spec.NodeName != n.name {
		return
	}
	w := n.workers[pod.UID]
	if w == nil {
		if deleted {
			return
		}
		w = newPodWorker(n, pod)
		n.workers[pod.UID] = w
		n.named[key] = w
		n.wg.Add(1)
		go w.run(n.ctx)
	}
	w.update(pod, deleted)
}

// forget drops a worker whose pod is gone; Logs still finds it by name.
func (n *Node) forget(w *podWorker) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.workers, w.uid)
}
