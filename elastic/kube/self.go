package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/elasticps/elasticps/elastic"
)

// serviceAccountNamespace is where a pod's service-account volume gives its namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Self is the pod a coordinator runs in, and what a Config made from it needs: a coordinator
// that starts its job's servers and workers as pods like its own (same image, service account,
// volumes, node selector, tolerations, security context) reads it with CurrentPod and FromPod.
type Self struct {
	// Pod is the pod as read.
	Pod *corev1.Pod
	// Namespace is the pod's, and the job's.
	Namespace string
	// Job is the job's name: the pod's label elasticps.io/job, or else the name of the Job that
	// owns the pod.
	Job string
	// Template is the pod's spec and labels, less what is the coordinator's alone (its node,
	// hostname and subdomain, its container's arguments, ports and probes, the variables the scaler
	// sets, the service-account volume the apiserver added, the labels of its Job's
	// controller): Config.Template.
	Template corev1.PodTemplateSpec
	// Container is the name of the program's container: Config.Container.
	Container string
	// Owner is the pod's controller (its Job) as an owner that controls nothing, so that
	// deleting the Job deletes the job's pods and Service while the Job's controller never counts
	// them as its own: Config.Owner. Nil when the pod has no controller.
	Owner *metav1.OwnerReference
	// Secret is where the container's ELASTICPS_SECRET comes from: Config.Secret.
	Secret corev1.SecretKeySelector
}

// CurrentPod reads the pod this process runs in: its name from the environment variable
// POD_NAME and its namespace from POD_NAMESPACE, or else from the service account's volume
// (give both through the downward API, as examples/k8s/job.yaml does).
func CurrentPod(ctx context.Context, client kubernetes.Interface) (*corev1.Pod, error) {
	name, ns := os.Getenv(EnvPodName), os.Getenv(EnvNamespace)
	if ns == "" {
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	if name == "" || ns == "" {
		return nil, fmt.Errorf("%w: this process does not know its pod: set %s and %s from the downward API (fieldRef metadata.name and metadata.namespace)",
			elastic.ErrInvalidConfig, EnvPodName, EnvNamespace)
	}
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("kube: read this process's pod %s/%s: %w", ns, name, err)
	}
	return pod, nil
}

// FromPod returns what a coordinator running in pod needs to start its job's other pods like
// it; container names the program's container ("": the pod's only one). The container must get
// ELASTICPS_SECRET from a Secret (valueFrom.secretKeyRef): the other pods get it the same way.
func FromPod(pod *corev1.Pod, container string) (*Self, error) {
	s := &Self{Pod: pod, Namespace: pod.Namespace, Job: pod.Labels[LabelJob]}
	ctl := metav1.GetControllerOf(pod)
	if s.Job == "" && ctl != nil && ctl.Kind == "Job" {
		s.Job = ctl.Name
	}
	var errs []error
	if s.Job == "" {
		errs = append(errs, fmt.Errorf("pod %s/%s has no label %s and no Job owns it: the job has no name", pod.Namespace, pod.Name, LabelJob))
	}
	if ctl != nil {
		s.Owner = &metav1.OwnerReference{APIVersion: ctl.APIVersion, Kind: ctl.Kind, Name: ctl.Name, UID: ctl.UID}
	}
	spec := *pod.Spec.DeepCopy()
	i := 0
	if container != "" {
		i = slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == container })
	} else if len(spec.Containers) != 1 {
		i = -1
	}
	if i < 0 {
		return nil, errors.Join(append(errs, fmt.Errorf("pod %s/%s: no container %q (name it when the pod has several)", pod.Namespace, pod.Name, container))...)
	}
	c := &spec.Containers[i]
	s.Container = c.Name
	for _, e := range c.Env {
		if e.Name == EnvSecret && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			s.Secret = *e.ValueFrom.SecretKeyRef.DeepCopy()
		}
	}
	if s.Secret.Name == "" {
		errs = append(errs, fmt.Errorf("container %s of pod %s/%s does not get %s from a Secret (valueFrom.secretKeyRef)", c.Name, pod.Namespace, pod.Name, EnvSecret))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, errors.Join(errs...))
	}
	// What the scaler sets per pod, and what is the coordinator's alone.
	c.Args, c.Ports = nil, nil
	c.ReadinessProbe, c.LivenessProbe, c.StartupProbe = nil, nil, nil
	c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool {
		return strings.HasPrefix(e.Name, "ELASTICPS_") || e.Name == EnvPodName || e.Name == EnvNamespace || e.Name == EnvPodIP
	})
	// The apiserver adds the service-account volume to every pod it admits: it adds its own to
	// the pods made from the template.
	var dropped []string
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool {
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			dropped = append(dropped, v.Name)
			return true
		}
		return false
	})
	for j := range spec.Containers {
		spec.Containers[j].VolumeMounts = slices.DeleteFunc(spec.Containers[j].VolumeMounts, func(m corev1.VolumeMount) bool {
			return slices.Contains(dropped, m.Name)
		})
	}
	spec.NodeName, spec.Hostname, spec.Subdomain = "", "", ""
	spec.EphemeralContainers = nil
	labels := map[string]string{}
	for k, v := range pod.Labels {
		if !strings.HasPrefix(k, "batch.kubernetes.io/") && k != "controller-uid" && k != "job-name" && k != LabelRole && k != LabelNode {
			labels[k] = v
		}
	}
	s.Template = corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
	return s, nil
}

// Addr returns the pod's stable address at port: hostname.subdomain.namespace.svc.domain:port
// (domain "" is DefaultClusterDomain), the name its Service gives it, which a replacement pod of
// the same hostname and subdomain keeps. A pod with no hostname or subdomain has none
// (ErrInvalidConfig): workers would lose the coordinator when its pod is replaced.
func (s *Self) Addr(domain string, port int) (string, error) {
	if s.Pod.Spec.Hostname == "" || s.Pod.Spec.Subdomain == "" {
		return "", fmt.Errorf("%w: pod %s/%s has no hostname and subdomain, so no name that outlives it", elastic.ErrInvalidConfig, s.Namespace, s.Pod.Name)
	}
	if domain == "" {
		domain = DefaultClusterDomain
	}
	host := fmt.Sprintf("%s.%s.%s.svc.%s", s.Pod.Spec.Hostname, s.Pod.Spec.Subdomain, s.Namespace, domain)
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}
