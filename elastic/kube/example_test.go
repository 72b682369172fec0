package kube_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// Every pod of a job has its name, and every server its address, from the job's name.
func ExampleServerAddr() {
	fmt.Println(kube.PodName("ctr", elastic.WorkerID(3)))
	fmt.Println(kube.ServerAddr("ctr", "training", kube.DefaultClusterDomain, 0, kube.DefaultPort))
	// Output:
	// ctr-worker-3
	// ctr-ps-0.ctr.training.svc.cluster.local:7070
}

// A coordinator in a pod of its own (service account elasticps, examples/k8s/rbac.yaml) runs
// its job while it holds the job's Lease: it starts the servers, builds the coordinator over
// them, tells the scaler to report failed pods to it, and then hands it the plan with the
// workers. Another replica of the coordinator's pod waits, and takes the job over (Resume) if
// this one dies. (Not run: it needs a cluster.)
func Example_coordinator() {
	ctx := context.Background()
	rc, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		log.Fatal(err)
	}
	const namespace, job = "training", "ctr"
	secret := []byte(os.Getenv(kube.EnvSecret)) // the coordinator's pod has the Secret too
	reach := func(id, addr string) (elastic.ParameterServer, error) {
		return remote.NewServer(ps.Node{ID: id, Addr: addr}, remote.Config{Secret: secret})
	}
	err = kube.Lead(ctx, kube.LeaderConfig{Client: client, Namespace: namespace, Name: job, Identity: os.Getenv(kube.EnvPodName)},
		func(ctx context.Context) {
			s, err := kube.New(ctx, kube.Config{
				Client: client, Namespace: namespace, Job: job,
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "dlrm", Image: "registry.example/dlrm:1.4", Command: []string{"/dlrm"},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi")}},
					}},
					PriorityClassName: "training",
				}},
				Args: func(l kube.Launch) []string {
					args := []string{"-role=" + l.Role.String(), "-id=" + l.ID, "-restart=" + strconv.Itoa(l.Restart),
						"-coordinator=" + os.Getenv(kube.EnvPodIP) + ":7070"}
					if l.Addr != "" {
						args = append(args, "-listen=:7070", "-advertise="+l.Addr)
					}
					return args
				},
				Secret: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "ctr-secret"}, Key: "secret"},
				// Owner: the coordinator's Job (not its pod, which a takeover replaces), so that
				// deleting the Job deletes every pod of the job.
				Server:      reach,
				MaxRestarts: 3,
				OnEvent:     func(ev kube.Event) { log.Println(ev) }, // an autoscaler reads OOM kills and pending pods here
			})
			if err != nil {
				log.Fatal(err)
			}
			defer s.Close()
			plan := elastic.Plan{Servers: 2, Server: elastic.Resources{CPUs: 4, Memory: 16 << 30}, Worker: elastic.Resources{CPUs: 2}}
			if err := s.Scale(ctx, plan); err != nil { // the servers first: the coordinator needs them
				log.Fatal(err)
			}
			var servers []elastic.ParameterServer
			for i := range plan.Servers {
				srv, err := reach(elastic.ServerID(i), kube.ServerAddr(job, namespace, kube.DefaultClusterDomain, i, kube.DefaultPort))
				if err != nil {
					log.Fatal(err)
				}
				servers = append(servers, srv)
			}
			coord, err := elastic.NewCoordinator(ctx, elastic.Config{Job: job, Servers: servers, Scaler: s, Secret: secret,
				Dispatcher: shard.Config{Dataset: shard.IndexedDataset(1 << 30)}})
			if err != nil {
				log.Fatal(err)
			}
			defer coord.Close()
			s.SetReporter(coord) // crashed, OOM-killed, evicted pods are failures the coordinator acts on at once
			plan.Workers = 8
			if err := coord.SetPlan(ctx, plan); err != nil {
				log.Fatal(err)
			}
			select {
			case <-coord.Done():
			case <-ctx.Done(): // the lease is lost: another coordinator takes the job over
			}
		})
	if err != nil {
		log.Fatal(err)
	}
}
