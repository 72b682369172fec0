package kubetest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/elasticps/elasticps/internal/wait"
)

// Options configure a control plane. The zero value is ready to use.
type Options struct {
	// Namespaces are created at start, each with its default ServiceAccount. The namespace
	// "default" always gets its ServiceAccount. Tests may add more with CreateNamespace.
	Namespaces []string

	// StartTimeout bounds the start, from the first process to the last readiness check.
	// Zero means 2 minutes: a start takes about 5 s on an idle 2-core machine, more while other
	// tests build and run beside it.
	StartTimeout time.Duration

	// APIServerFlags and SchedulerFlags are appended to the flags the package passes
	// ("--name=value"), so a later one overrides it.
	APIServerFlags []string
	SchedulerFlags []string

	// Controllers, if not empty, starts a kube-controller-manager that runs these controllers
	// (its --controllers names, which `kube-controller-manager --help` lists:
	// "garbage-collector-controller", "job-controller", "persistentvolume-binder-controller",
	// "replicaset-controller"...; the older short names, "garbagecollector", "job", work too),
	// as the administrator. Empty: no controller manager runs, so owner references delete
	// nothing and no controller makes pods for a Job or a Deployment. The node lifecycle
	// controller is best left out: no kubelet renews the nodes' Leases, and it would mark
	// every node NotReady.
	Controllers []string
	// ControllerFlags are appended to the controller manager's flags.
	ControllerFlags []string
}

// ServiceCIDR is the range of Service cluster IPs the apiserver allocates from.
const ServiceCIDR = "10.96.0.0/16"

// adminUser and schedulerUser are the static token file's users.
const (
	adminUser     = "kubetest-admin"
	schedulerUser = "system:kube-scheduler"
)

// ControlPlane is a running etcd, kube-apiserver and kube-scheduler. Its exported fields are set
// by Launch and not changed after.
type ControlPlane struct {
	// URL is the apiserver's address, https://127.0.0.1:PORT.
	URL string
	// Config is an administrator's client config (group system:masters). Copy it with
	// rest.CopyConfig before changing it.
	Config *rest.Config
	// Client is a clientset made from Config.
	Client kubernetes.Interface
	// StartTime is how long Launch took, from the first process started to the control plane
	// ready.
	StartTime time.Duration

	dir   string // holds certificates, data and logs; removed by Stop
	caPEM []byte

	procs []*process // etcd, kube-apiserver, kube-scheduler, kube-controller-manager, in start order

	stopOnce sync.Once
	stopped  chan struct{} // closed by Stop: cuts WaitPod and the like short
}

// Start launches a control plane for one test and stops it when the test ends. It fails the test
// if the control plane does not start. If the binaries are missing it skips the test, or fails
// it when the environment has CI=true, with a message saying how to build them. A failed test
// gets the tail of each process's log.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	ctx := t.Context()
	cp, err := Launch(ctx, opts)
	if err != nil {
		skipOrFail(t, err)
	}
	t.Cleanup(cp.Stop)
	cp.LogOnFailure(t)
	return cp
}

// skipOrFail ends the test for an error from Launch: a skip when only the binaries are missing
// and this is not CI, a failure otherwise.
func skipOrFail(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNoTools) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	t.Fatal(err)
}

// Launch starts a control plane that runs until Stop, whatever happens to ctx after it returns;
// ctx bounds the start only. An error wraps ErrNoTools when the binaries are missing; any other
// carries the tail of each process's log.
func Launch(ctx context.Context, opts Options) (*ControlPlane, error) {
	tl, err := findTools()
	if err != nil {
		return nil, err
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	cp := &ControlPlane{dir: dir, stopped: make(chan struct{})}
	start := time.Now()
	if err := cp.launch(ctx, tl, opts); err != nil {
		err = fmt.Errorf("kubetest: start: %w%s", err, cp.logTails())
		cp.Stop()
		return nil, err
	}
	cp.StartTime = time.Since(start)
	return cp, nil
}

func (cp *ControlPlane) launch(ctx context.Context, tl tools, opts Options) error {
	certs, err := writeCerts(cp.dir)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	cp.caPEM = certs.caPEM
	adminToken, schedToken := newToken(), newToken()
	tokens := filepath.Join(cp.dir, "tokens.csv")
	if err := writeTokens(tokens, []staticUser{
		{token: adminToken, name: adminUser, groups: "system:masters"},
		{token: schedToken, name: schedulerUser},
	}); err != nil {
		return err
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	schedURL := "https://127.0.0.1:" + strconv.Itoa(ports[3])
	controllerURL := "https://127.0.0.1:" + strconv.Itoa(ports[4])

	cp.Config = cp.ConfigFor(adminToken)
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return err
	}
	probe, err := cp.probeClient()
	if err != nil {
		return err
	}

	etcd, err := startProcess(cp.dir, "etcd", tl.etcd, []string{
		"--name=kubetest",
		"--data-dir=" + filepath.Join(cp.dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + etcdPeer,
		"--initial-advertise-peer-urls=" + etcdPeer,
		"--initial-cluster=kubetest=" + etcdPeer,
		"--unsafe-no-fsync", // a test's data dies with it: no need to wait for the disk
		"--log-level=warn",
	})
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, etcd)
	if err := cp.waitHealthy(ctx, probe, etcdURL+"/health", etcd); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}

	apiserver, err := startProcess(cp.dir, "kube-apiserver", tl.apiserver, append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--tls-cert-file=" + certs.servingCert,
		"--tls-private-key-file=" + certs.servingKey,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + certs.serviceAccountKey,
		"--service-account-signing-key-file=" + certs.serviceAccountKey,
		"--service-cluster-ip-range=" + ServiceCIDR,
		// With no controller manager nothing would keep the kubernetes Service's endpoints, and
		// the default reconciler refuses a loopback address.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}, opts.APIServerFlags...))
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, apiserver)
	if err := cp.waitReady(ctx, apiserver); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}

	// The scheduler starts once RBAC's default roles exist: started earlier, its informers are
	// refused, back off, and it is ready no sooner.
	schedKubeconfig := filepath.Join(cp.dir, "scheduler.kubeconfig")
	if err := cp.WriteKubeconfig(schedKubeconfig, schedToken); err != nil {
		return err
	}
	scheduler, err := startProcess(cp.dir, "kube-scheduler", tl.scheduler, append([]string{
		"--kubeconfig=" + schedKubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[3]),
		"--tls-cert-file=" + certs.servingCert,
		"--tls-private-key-file=" + certs.servingKey,
		"--profiling=false",
	}, opts.SchedulerFlags...))
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, scheduler)

	var controller *process
	if len(opts.Controllers) > 0 {
		kubeconfig := filepath.Join(cp.dir, "controller-manager.kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig, adminToken); err != nil {
			return err
		}
		controller, err = startProcess(cp.dir, "kube-controller-manager", tl.controller, append([]string{
			"--kubeconfig=" + kubeconfig,
			"--controllers=" + strings.Join(opts.Controllers, ","),
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[4]),
			"--tls-cert-file=" + certs.servingCert,
			"--tls-private-key-file=" + certs.servingKey,
			"--profiling=false",
		}, opts.ControllerFlags...))
		if err != nil {
			return err
		}
		cp.procs = append(cp.procs, controller)
	}

	for _, ns := range append([]string{metav1.NamespaceDefault}, opts.Namespaces...) {
		if err := cp.CreateNamespace(ctx, ns); err != nil {
			return err
		}
	}
	// The scheduler's readyz passes once its informers have synced: from then on it sees new pods.
	if err := cp.waitHealthy(ctx, probe, schedURL+"/readyz", scheduler); err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	if controller != nil {
		if err := cp.waitHealthy(ctx, probe, controllerURL+"/healthz", controller); err != nil {
			return fmt.Errorf("kube-controller-manager: %w", err)
		}
	}
	return nil
}

// probeClient returns an HTTP client for health endpoints served with the control plane's
// serving certificate (the scheduler's) or in plain HTTP (etcd's).
func (cp *ControlPlane) probeClient() (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cp.caPEM) {
		return nil, errors.New("bad CA certificate")
	}
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}, nil
}

// pollEvery is how often a start polls a process's health endpoint.
const pollEvery = 50 * time.Millisecond

// waitHealthy polls url until it answers 200, p exits, or ctx ends.
func (cp *ControlPlane) waitHealthy(ctx context.Context, c *http.Client, url string, p *process) error {
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		if err := p.exited(); err != nil {
			return err
		}
		if err := wait.Sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("%w (last: %v)", err, last)
		}
	}
}

// waitReady polls the apiserver's /readyz as the administrator until it passes, p exits, or ctx
// ends. /readyz passes once the post-start hooks have run: RBAC's default roles exist, and so do
// the system namespaces and priority classes.
func (cp *ControlPlane) waitReady(ctx context.Context, p *process) error {
	var last error
	for {
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			return nil
		}
		last = fmt.Errorf("%w: %s", err, body)
		if err := p.exited(); err != nil {
			return err
		}
		if err := wait.Sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("%w (last: %v)", err, last)
		}
	}
}

// CreateNamespace creates namespace name, if it does not exist, and its default ServiceAccount,
// which the controller manager would otherwise create and without which the apiserver refuses
// pods in it.
func (cp *ControlPlane) CreateNamespace(ctx context.Context, name string) error {
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubetest: create namespace %s: %w", name, err)
	}
	_, err = cp.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubetest: create default ServiceAccount in %s: %w", name, err)
	}
	return nil
}

// Stop stops the processes, SIGTERM first and SIGKILL to any still running 10 s later, and
// removes the directory that held their data. It is idempotent.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		close(cp.stopped)
		// The apiserver and scheduler first, so neither spends its shutdown reaching for etcd.
		var clients []*process
		for _, p := range cp.procs {
			if p.name != "etcd" {
				clients = append(clients, p)
			}
		}
		stopProcesses(10*time.Second, clients...)
		stopProcesses(10*time.Second, cp.procs...)
		_ = os.RemoveAll(cp.dir)
	})
}

// LogOnFailure arranges for t, if it has failed when it ends, to log the tail of each process's
// log and to say whether a process has exited. Start calls it; a Fixture calls it for each test
// that uses the shared control plane.
func (cp *ControlPlane) LogOnFailure(t testing.TB) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("kubetest: control plane at " + cp.URL + cp.logTails())
		}
	})
}

// logTailBytes is how much of each process's log a failure shows.
const logTailBytes = 8 << 10

// logTails returns the tail of every process's log, each under a header, and which have exited.
func (cp *ControlPlane) logTails() string {
	var b strings.Builder
	for _, p := range cp.procs {
		state := "running"
		if err := p.exited(); err != nil {
			state = err.Error()
		}
		fmt.Fprintf(&b, "\n--- %s (%s), last %d KiB of its log:\n%s", p.name, state, logTailBytes>>10, p.tail(logTailBytes))
	}
	return b.String()
}

// Fixture shares one control plane among the tests of a test binary that use it: the first Get
// starts it, and TestMain stops it after the tests have run.
//
//	var cluster kubetest.Fixture
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		cluster.Stop()
//		os.Exit(code)
//	}
//
// A Fixture must not be copied after first use.
type Fixture struct {
	// Options are those of the shared control plane; set them before the first Get.
	Options Options

	once sync.Once
	cp   *ControlPlane
	err  error
}

// Get returns the shared control plane, starting it on the first call. Like Start it skips or
// fails t when the binaries are missing, fails t if the control plane did not start (for every
// later test too, with the same error), and logs the processes' logs if t fails.
func (f *Fixture) Get(t testing.TB) *ControlPlane {
	t.Helper()
	f.once.Do(func() {
		// Not t's context: the control plane outlives the first test.
		f.cp, f.err = Launch(context.Background(), f.Options)
		if f.err == nil {
			t.Logf("kubetest: control plane started in %v", f.cp.StartTime.Round(time.Millisecond))
		}
	})
	if f.err != nil {
		skipOrFail(t, f.err)
	}
	f.cp.LogOnFailure(t)
	return f.cp
}

// Stop stops the shared control plane if it was started. It is idempotent.
func (f *Fixture) Stop() {
	f.once.Do(func() { f.err = errStopped })
	if f.cp != nil {
		f.cp.Stop()
	}
}
