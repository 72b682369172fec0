package kube

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/elasticps/elasticps/elastic"
)

// Labels and the annotation the scaler puts on its objects.
const (
	LabelJob  = "elasticps.io/job"  // the job's name, on every pod and the Service
	LabelRole = "elasticps.io/role" // "ps" or "worker"
	LabelNode = "elasticps.io/node" // the node id, "ps-0"

	// AnnotationRestart is a pod's Launch.Restart, its incarnation.
	AnnotationRestart = "elasticps.io/restart"

	// PortName names the servers' container port and the Service's port.
	PortName = "ps"
)

// The scaler's environment variables in every pod. ELASTICPS_SECRET comes from Config.Secret;
// the pod's own name, namespace and IP from the downward API.
const (
	EnvSecret    = "ELASTICPS_SECRET"
	EnvJob       = "ELASTICPS_JOB"
	EnvRole      = "ELASTICPS_ROLE"
	EnvNodeID    = "ELASTICPS_NODE_ID"
	EnvRestart   = "ELASTICPS_RESTART"
	EnvAddr      = "ELASTICPS_ADDR" // a server's ServerAddr
	EnvPodName   = "POD_NAME"
	EnvNamespace = "POD_NAMESPACE"
	EnvPodIP     = "POD_IP"
)

// ServerAddr returns the address of the i-th server of job in namespace: its DNS name in the
// job's headless Service, "<job>-ps-<i>.<job>.<namespace>.svc.<domain>:<port>".
func ServerAddr(job, namespace, domain string, i int, port int32) string {
	host := fmt.Sprintf("%s.%s.%s.svc.%s", PodName(job, elastic.ServerID(i)), job, namespace, domain)
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// PodName returns the name of node id's pod in job: "<job>-<id>".
func PodName(job, id string) string { return job + "-" + id }

// jobLabels are the labels of every object of the job.
func jobLabels(job string) map[string]string {
	return map[string]string{
		LabelJob:                       job,
		"app.kubernetes.io/name":       "elasticps",
		"app.kubernetes.io/instance":   job,
		"app.kubernetes.io/managed-by": "elasticps",
	}
}

// owned reports whether labels are those of an object of job.
func owned(labels map[string]string, job string) bool {
	return labels[LabelJob] == job && labels["app.kubernetes.io/managed-by"] == "elasticps"
}

// service returns the job's headless Service: it gives every pod of the job (servers and
// workers) a DNS name, ready or not, so that a server is reached at its ServerAddr as soon as
// it listens.
func (s *Scaler) service() *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.cfg.Job, Namespace: s.cfg.Namespace, Labels: jobLabels(s.cfg.Job)},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 map[string]string{LabelJob: s.cfg.Job},
			PublishNotReadyAddresses: true,
			Ports: []corev1.ServicePort{{Name: PortName, Port: s.cfg.Port, TargetPort: intstr.FromString(PortName),
				Protocol: corev1.ProtocolTCP}},
		},
	}
	if s.cfg.Owner != nil {
		svc.OwnerReferences = []metav1.OwnerReference{*s.cfg.Owner}
	}
	return svc
}

// launch returns node n's start l, for its restart-th pod of size.
func (s *Scaler) launch(n *node, restart int, size elastic.Resources) Launch {
	l := Launch{Role: n.role, ID: n.id, Restart: restart, Size: size}
	if n.role == elastic.RoleServer {
		l.Addr = ServerAddr(s.cfg.Job, s.cfg.Namespace, s.cfg.ClusterDomain, n.index, s.cfg.Port)
	}
	return l
}

// pod returns the pod of start l: the template with the scaler's settings.
func (s *Scaler) pod(l Launch) *corev1.Pod {
	t := s.cfg.Template.DeepCopy()
	name := PodName(s.cfg.Job, l.ID)
	labels := t.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range jobLabels(s.cfg.Job) {
		labels[k] = v
	}
	labels[LabelRole] = l.Role.String()
	labels[LabelNode] = l.ID
	labels["app.kubernetes.io/component"] = l.Role.String()
	annotations := t.Annotations
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[AnnotationRestart] = strconv.Itoa(l.Restart)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.cfg.Namespace, Labels: labels, Annotations: annotations},
		Spec:       t.Spec,
	}
	if s.cfg.Owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*s.cfg.Owner}
	}
	spec := &p.Spec
	spec.Hostname, spec.Subdomain = name, s.cfg.Job
	spec.RestartPolicy = corev1.RestartPolicyNever
	grace := int64(math.Ceil(s.cfg.StopGrace.Seconds()))
	spec.TerminationGracePeriodSeconds = &grace

	c := &spec.Containers[s.container]
	c.Args = append(c.Args, s.cfg.Args(l)...)
	setResources(&c.Resources, l.Size)
	if l.Role == elastic.RoleServer {
		c.Ports = slices.DeleteFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == PortName })
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: PortName, ContainerPort: s.cfg.Port, Protocol: corev1.ProtocolTCP})
	}
	c.Env = s.env(c, l)
	return p
}

// env returns container c's environment for start l: the template's, the scaler's, then
// Config.Env's; of a name given twice the last is kept.
func (s *Scaler) env(c *corev1.Container, l Launch) []corev1.EnvVar {
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	secret := s.cfg.Secret
	env := slices.Clone(c.Env)
	env = append(env,
		corev1.EnvVar{Name: EnvSecret, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &secret}},
		corev1.EnvVar{Name: EnvJob, Value: s.cfg.Job},
		corev1.EnvVar{Name: EnvRole, Value: l.Role.String()},
		corev1.EnvVar{Name: EnvNodeID, Value: l.ID},
		corev1.EnvVar{Name: EnvRestart, Value: strconv.Itoa(l.Restart)},
		field(EnvPodName, "metadata.name"),
		field(EnvNamespace, "metadata.namespace"),
		field(EnvPodIP, "status.podIP"),
	)
	if l.Addr != "" {
		env = append(env, corev1.EnvVar{Name: EnvAddr, Value: l.Addr})
	}
	// The Go runtime's limits follow the container's, as the process scaler's do, unless the
	// template sets them.
	for name, r := range map[string]corev1.ResourceName{"GOMAXPROCS": corev1.ResourceCPU, "GOMEMLIMIT": corev1.ResourceMemory} {
		if _, ok := c.Resources.Limits[r]; ok && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name }) {
			env = append(env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: c.Name, Resource: "limits." + string(r)}}})
		}
	}
	if s.cfg.Env != nil {
		env = append(env, s.cfg.Env(l)...)
	}
	// Keep the last of each name (where it is: a value may refer to the variables before it).
	last := map[string]int{}
	for i, e := range env {
		last[e.Name] = i
	}
	out := env[:0:0]
	for i, e := range env {
		if last[e.Name] == i {
			out = append(out, e)
		}
	}
	return out
}

// setResources makes size the container's requests and limits (requests = limits), for the
// fields size sets.
func setResources(r *corev1.ResourceRequirements, size elastic.Resources) {
	set := func(name corev1.ResourceName, q resource.Quantity) {
		if r.Requests == nil {
			r.Requests = corev1.ResourceList{}
		}
		if r.Limits == nil {
			r.Limits = corev1.ResourceList{}
		}
		r.Requests[name], r.Limits[name] = q, q
	}
	if size.CPUs > 0 {
		set(corev1.ResourceCPU, *resource.NewMilliQuantity(int64(math.Ceil(size.CPUs*1000)), resource.DecimalSI))
	}
	if size.Memory > 0 {
		set(corev1.ResourceMemory, *resource.NewQuantity(size.Memory, resource.BinarySI))
	}
}

// grown returns size with the memory an OOM-killed pod whose limit was limit gets: limit (or
// size's memory, when the pod had no limit) times Config.OOMGrowth, rounded up to a whole MiB
// (as autoscale's planner rounds the memory it asks for, so that the two agree), capped at
// MaxMemory.
func (s *Scaler) grown(size elastic.Resources, limit int64) elastic.Resources {
	if limit <= 0 {
		limit = size.Memory
	}
	if limit <= 0 {
		return size // no limit: the node ran out of memory, and more would not help
	}
	const mib = 1 << 20
	m := int64(math.Ceil(float64(limit)*s.cfg.OOMGrowth/mib)) * mib
	if s.cfg.MaxMemory > 0 {
		m = min(m, max(s.cfg.MaxMemory, limit))
	}
	size.Memory = m
	return size
}
