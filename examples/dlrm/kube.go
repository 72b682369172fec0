package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
)

// kubePorts are the ports of a job's pods on Kubernetes: each pod has an address of its own.
const (
	kubeServerPort  = 7070
	kubeMetricsPort = 9090
	// kubeMaxRestarts is how often a server's or a worker's pod that ends abnormally (a crash,
	// an OOM kill, a deletion behind the coordinator's back) is replaced under its name.
	kubeMaxRestarts = 5
)

// kubeRoleFlags are the flags that say which process of a job this is: the coordinator passes every
// other flag it was given on to the servers and workers it starts, and sets these per pod.
var kubeRoleFlags = map[string]bool{
	"role": true, "kube": true, "id": true, "listen": true, "servers": true, "dispatcher": true,
	"ps": true, "workers": true, "gossip": true, "seeds": true, "secret-file": true,
	"status-addr": true, "metrics-addr": true, "scale-at": true,
	"ps-memory": true, "ps-cpus": true, "worker-memory": true, "worker-cpus": true,
	"autoscale": true, "autoscale-every": true, "pending-for": true, "near-memory": true,
}

// runKubeCoordinator runs the coordinator of a job on Kubernetes, in a pod: while it holds the
// job's Lease, it starts the job's servers and workers as pods of its own pod's image and
// settings (elastic/kube), and coordinates them; a coordinator interrupted (its pod deleted)
// leaves the job running for the next, which the pod's Job starts and which takes the job over.
func runKubeCoordinator(ctx context.Context, o *options, rc train.RoleConfig, run func(context.Context, train.RoleConfig) error) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("-kube: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("-kube: %w", err)
	}
	pod, err := kube.CurrentPod(ctx, client)
	if err != nil {
		return fmt.Errorf("-kube: %w", err)
	}
	self, err := kube.FromPod(pod, "")
	if err != nil {
		return fmt.Errorf("-kube: %w", err)
	}
	dispatcher, err := self.Addr("", listenPort(o.listen))
	if err != nil {
		return fmt.Errorf("-kube: %w", err)
	}
	var leadErr error
	err = kube.Lead(ctx, kube.LeaderConfig{Client: client, Namespace: self.Namespace, Name: self.Job + "-coordinator",
		Identity: self.Pod.Name, Logger: rc.Logger}, func(ctx context.Context) {
		leadErr = leadJob(ctx, o, rc, client, self, dispatcher, run)
	})
	if err != nil {
		return err
	}
	if leadErr == nil && ctx.Err() != nil {
		return train.ErrHandedOver
	}
	return leadErr
}

// leadJob runs the job as its coordinator, once the Lease is held.
func leadJob(ctx context.Context, o *options, rc train.RoleConfig, client kubernetes.Interface, self *kube.Self, dispatcher string,
	run func(context.Context, train.RoleConfig) error) error {
	var (
		remotes   []*remote.Server
		remotesMu sync.Mutex
	)
	defer func() {
		remotesMu.Lock()
		defer remotesMu.Unlock()
		for _, r := range remotes {
			r.Close()
		}
	}()
	secret := rc.Secret
	auto, err := newKubeAutoscale(o, rc)
	if err != nil {
		return err
	}
	first := kube.ServerAddr(self.Job, self.Namespace, kube.DefaultClusterDomain, 0, kubeServerPort)
	scaler, err := kube.New(ctx, kube.Config{
		Client: client, Namespace: self.Namespace, Job: self.Job,
		Template: self.Template, Container: self.Container, Owner: self.Owner, Secret: self.Secret,
		Port: kubeServerPort, MaxRestarts: kubeMaxRestarts, PendingTimeout: auto.pendingTimeout(), OnEvent: auto.podEvent,
		Args: func(l kube.Launch) []string { return podArgs(o, l, dispatcher, first) },
		Server: func(id, addr string) (elastic.ParameterServer, error) {
			rs, err := remote.NewServer(ps.Node{ID: id, Addr: addr}, remote.Config{Secret: secret, Logger: rc.Logger})
			if err != nil {
				return nil, err
			}
			remotesMu.Lock()
			remotes = append(remotes, rs)
			remotesMu.Unlock()
			return rs, nil
		},
		Logger: rc.Logger,
	})
	if err != nil {
		return err
	}
	handedOver := false
	defer func() {
		if handedOver {
			scaler.Leave()
		} else {
			scaler.Close()
		}
	}()
	plan := elastic.Plan{Servers: o.cfg.Servers, Workers: o.cfg.Workers, Server: o.psSize, Worker: o.workerSize}
	defer auto.stop()
	if err := auto.scale(ctx, scaler, plan); err != nil {
		handedOver = ctx.Err() != nil
		return fmt.Errorf("start the job's pods: %w", err)
	}
	for i := range plan.Servers {
		rc.PS = append(rc.PS, ps.Node{ID: elastic.ServerID(i), Addr: kube.ServerAddr(self.Job, self.Namespace, kube.DefaultClusterDomain, i, kubeServerPort)})
	}
	rc.Scaler = scaler
	rc.OnCoordinator = func(c *elastic.Coordinator) { scaler.SetReporter(c); auto.start(ctx, c, scaler) }
	rc.HandOver = true
	err = run(ctx, rc)
	handedOver = errors.Is(err, train.ErrHandedOver)
	return err
}

// podArgs returns the arguments of a server's or a worker's pod: the coordinator's own flags but
// those that say which process it is, and the role's.
func podArgs(o *options, l kube.Launch, dispatcher, first string) []string {
	args := append([]string(nil), o.passOn...)
	switch l.Role {
	case elastic.RoleServer:
		args = append(args, "-role=ps", "-id="+l.ID, "-listen=$(POD_IP):"+strconv.Itoa(kubeServerPort), "-servers="+l.ID+"="+l.Addr)
	default:
		// A worker learns the servers from the owner table; the first server, which every plan
		// has, is where its client starts.
		args = append(args, "-role=worker", "-id="+l.ID, "-dispatcher="+dispatcher, "-servers="+elastic.ServerID(0)+"="+first)
	}
	if o.cfg.MetricsAddr != "" {
		args = append(args, "-metrics-addr=$(POD_IP):"+strconv.Itoa(kubeMetricsPort))
	}
	return args
}

// listenPort returns the port of a HOST:PORT address, 0 if it has none.
func listenPort(addr string) int {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(port)
	return p
}
