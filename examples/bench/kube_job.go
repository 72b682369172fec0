package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
	"github.com/elasticps/elasticps/internal/wait"
)

// kubeImage is the image the suite's pods name: the node agent runs the dlrm binary for it.
const kubeImage = "elasticps/dlrm:bench"

// kubeSA and kubeSecret are the job's ServiceAccount and Secret (examples/k8s/rbac.yaml and
// secret.yaml, as objects).
const (
	kubeSA     = "elasticps"
	kubeSecret = "elasticps"
)

// kubePollEvery is how often the suite asks the coordinator for its status and the apiserver for
// pods that should be gone: the control port has no call that waits. It bounds the resolution
// of every time the suite reports, subjects and baselines alike.
const kubePollEvery = 20 * time.Millisecond

// kubeWaitFor bounds each wait of the suite for an event (a pod gone, a status, a pod's
// address): an event that does not come fails the suite rather than hang it.
const kubeWaitFor = time.Minute

// kubeDataFlags are the dlrm flags of the suite's job, the same for every start of it: a small
// synthetic job that trains far longer than the suite runs.
var kubeDataFlags = []string{
	"-train-records=40000", "-test-records=1000", "-batch=100", "-dim=4", "-bottom=8", "-top=8",
	"-epochs=1000", "-duration=0", "-checkpoint-every=100", "-checkpoint-interval=2s",
	"-checkpoint-dir=/mnt/dlrm", "-shm-dir=/dev/shm/dlrm", "-log-format=json",
}

// kubeJob is the suite's DLRM job on the local control plane: a coordinator pod that starts its
// servers and workers as pods through elastic/kube, and the control port the suite reads.
type kubeJob struct {
	cp        *kubetest.ControlPlane
	node      *kubetest.Node
	ns, name  string
	secret    []byte
	ckptDir   string // the machine's directory mounted as the checkpoint claim
	psMemory  string // each server pod's memory (-ps-memory)
	ctl       *remote.Control
	coordName string
}

// psBytes is psMemory in bytes.
func (j *kubeJob) psBytes() int64 {
	q := resource.MustParse(j.psMemory)
	return q.Value()
}

// setUp makes the namespace's ServiceAccount with the coordinator's rights, and the Secret.
func (j *kubeJob) setUp(ctx context.Context) error {
	if err := j.cp.CreateNamespace(ctx, j.ns); err != nil {
		return err
	}
	c := j.cp.Client
	if _, err := c.CoreV1().ServiceAccounts(j.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: kubeSA}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: kubeSA}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}}
	if _, err := c.RbacV1().Roles(j.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: kubeSA},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: kubeSA},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: kubeSA, Namespace: j.ns}}}
	if _, err := c.RbacV1().RoleBindings(j.ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	j.secret = []byte(base64.StdEncoding.EncodeToString(key))
	_, err := c.CoreV1().Secrets(j.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kubeSecret},
		StringData: map[string]string{"secret": string(j.secret)}}, metav1.CreateOptions{})
	return err
}

// podSpec is the spec of the coordinator's pod, which its servers and workers copy (the
// scaler's Template): the image, the secret, the checkpoint directory and a shared-memory
// emptyDir.
func (j *kubeJob) podSpec(args []string) corev1.PodSpec {
	hostPathDir := corev1.HostPathDirectory
	return corev1.PodSpec{
		ServiceAccountName:            kubeSA,
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: new(int64(30)),
		Containers: []corev1.Container{{
			Name:  "dlrm",
			Image: kubeImage,
			Args:  args,
			Env: []corev1.EnvVar{
				{Name: kube.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: kube.EnvNamespace, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: kube.EnvPodIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: kube.EnvSecret, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: kubeSecret}, Key: "secret"}}},
			},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			},
			VolumeMounts: []corev1.VolumeMount{{Name: "checkpoints", MountPath: "/mnt"}, {Name: "shm", MountPath: "/dev/shm"}},
		}},
		Volumes: []corev1.Volume{
			{Name: "checkpoints", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: j.ckptDir, Type: &hostPathDir}}},
			{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: new(resource.MustParse("512Mi"))}}},
		},
	}
}

// startCoordinator creates the job's coordinator pod for servers servers and two workers
// (resume: from the newest commit of the checkpoint directory) and connects to its control
// port once its pod has an address. It does not wait for training.
func (j *kubeJob) startCoordinator(ctx context.Context, servers int, resume bool) error {
	args := append([]string{"-role=coordinator", "-kube", "-listen=$(POD_IP):7071", "-status-addr=$(POD_IP):8080",
		"-ps=" + strconv.Itoa(servers), "-workers=2", "-ps-memory=" + j.psMemory}, kubeDataFlags...)
	if resume {
		args = append(args, "-resume")
	}
	spec := j.podSpec(args)
	spec.Hostname, spec.Subdomain = "coordinator", j.name
	spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "control", ContainerPort: 7071}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: j.coordName, Labels: map[string]string{kube.LabelJob: j.name, kube.LabelRole: "coordinator"}},
		Spec:       spec,
	}
	if _, err := j.cp.Client.CoreV1().Pods(j.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the coordinator's pod: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, kubeWaitFor)
	defer cancel()
	p, err := j.cp.WaitPod(wctx, j.ns, j.coordName, func(p *corev1.Pod) bool { return p.Status.PodIP != "" })
	if err != nil {
		return err
	}
	if j.ctl != nil {
		j.ctl.Close()
	}
	j.ctl, err = remote.NewControl(remote.Config{Addr: net.JoinHostPort(p.Status.PodIP, "7071"), Secret: j.secret})
	return err
}

// stopAll stops the job as fast as it can be stopped: the coordinator's pod and then every
// other pod of the job removed at once (grace 0: their processes are killed), and the job's
// Lease deleted, so that the next coordinator need not wait for it to expire. It returns once
// the pods are gone.
func (j *kubeJob) stopAll(ctx context.Context) error {
	pods := j.cp.Client.CoreV1().Pods(j.ns)
	now := metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}
	if err := pods.Delete(ctx, j.coordName, now); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := j.waitNoPods(ctx, "metadata.name="+j.coordName, ""); err != nil {
		return err
	}
	sel := metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + j.name}
	if err := pods.DeleteCollection(ctx, now, sel); err != nil {
		return err
	}
	if err := j.waitNoPods(ctx, "", sel.LabelSelector); err != nil {
		return err
	}
	err := j.cp.Client.CoordinationV1().Leases(j.ns).Delete(ctx, j.name+"-coordinator", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// waitNoPods polls until no pod matches the selectors.
func (j *kubeJob) waitNoPods(ctx context.Context, fields, labels string) error {
	ctx, cancel := context.WithTimeout(ctx, kubeWaitFor)
	defer cancel()
	for {
		list, err := j.cp.Client.CoreV1().Pods(j.ns).List(ctx, metav1.ListOptions{FieldSelector: fields, LabelSelector: labels})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		if err := wait.Sleep(ctx, kubePollEvery); err != nil {
			return fmt.Errorf("waiting for %d pods to go: %w", len(list.Items), err)
		}
	}
}

// awaitStatus asks the coordinator for its status until cond holds of it, and returns it with
// the time it was read. Errors (the coordinator not up yet) are retried until ctx ends.
func (j *kubeJob) awaitStatus(ctx context.Context, what string, cond func(elastic.Status) bool) (elastic.Status, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, kubeWaitFor)
	defer cancel()
	var last error
	for {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := j.ctl.Status(c)
		cancel()
		at := time.Now()
		if err == nil && cond(st) {
			return st, at, nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("last status: %s, step %d, commit %d, recoveries %d", st.Phase, st.Step, st.LastCommit, st.Recoveries)
		}
		if err := wait.Sleep(ctx, kubePollEvery); err != nil {
			return st, at, fmt.Errorf("waiting for %s: %w (%v)", what, err, last)
		}
	}
}

// steady waits until the job trains with a commit behind it and at least a few steps since,
// and no recovery or move under way, so that each event starts from the same kind of state.
func (j *kubeJob) steady(ctx context.Context, servers int) (elastic.Status, error) {
	var since uint64
	st, _, err := j.awaitStatus(ctx, "steady training", func(st elastic.Status) bool {
		if st.Phase != "training" || st.Commits == 0 || len(st.Servers) != servers || len(st.Migrating) > 0 || failed(st) {
			return false
		}
		if since == 0 {
			since = st.Step
		}
		return st.Step >= since+20
	})
	return st, err
}

func failed(st elastic.Status) bool {
	for _, s := range st.Servers {
		if s.Failed {
			return true
		}
	}
	return false
}

// workerSteps sums the steps the coordinator's workers reported to it: zero for a coordinator
// that has seen no step yet.
func workerSteps(st elastic.Status) uint64 {
	var n uint64
	for _, w := range st.Workers {
		n += w.Steps
	}
	return n
}

// pod returns the job's pod of node id id.
func (j *kubeJob) pod(ctx context.Context, id string) (*corev1.Pod, error) {
	return j.cp.Client.CoreV1().Pods(j.ns).Get(ctx, kube.PodName(j.name, id), metav1.GetOptions{})
}

// logs returns the tail of each of the job's pods' output, for an error.
func (j *kubeJob) logs(ctx context.Context) string {
	list, err := j.cp.Client.CoreV1().Pods(j.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + j.name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range list.Items {
		out := j.node.Logs(j.ns, p.Name)
		if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		fmt.Fprintf(&b, "\n--- pod %s (%s):\n%s", p.Name, p.Status.Phase, out)
	}
	return b.String()
}

// deleteDefault deletes a pod as kubectl delete pod does: with the grace period of its spec.
var deleteDefault = metav1.DeleteOptions{}

// errNotDone marks a measured event that did not happen as it should: the suite fails.
var errNotDone = errors.New("did not happen")
