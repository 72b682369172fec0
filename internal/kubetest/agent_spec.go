package kubetest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// refusal says why a pod's container does not start now: for good (final: the pod fails with
// reason and message) or for the time being (reason is the container's waiting reason; the
// agent tries again when the pod changes, and after retryEvery if retry is set).
type refusal struct {
	final   bool
	retry   bool
	reason  string
	message string
}

func (r *refusal) Error() string { return r.reason + ": " + r.message }

// Reasons the agent gives, besides the kubelet's own (ErrImageNeverPull,
// CreateContainerConfigError, ContainerCreating, CrashLoopBackOff).
const (
	// ReasonUnsupported fails a pod the agent cannot run: more than one container, init or
	// ephemeral containers, a volume type or mount it does not emulate.
	ReasonUnsupported = "Unsupported"
	// ReasonPodIPCollision fails the later of two live pods whose names hash to one PodIP.
	ReasonPodIPCollision = "PodIPCollision"
)

func unsupported(format string, args ...any) *refusal {
	return &refusal{final: true, reason: ReasonUnsupported, message: fmt.Sprintf(format, args...)}
}

func configError(format string, args ...any) *refusal {
	return &refusal{retry: true, reason: "CreateContainerConfigError", message: fmt.Sprintf(format, args...)}
}

// checkShape refuses, for good, a pod that is not one container and no more.
func checkShape(pod *corev1.Pod) *refusal {
	switch {
	case len(pod.Spec.Containers) != 1:
		return unsupported("the kubetest agent runs pods of exactly one container; this one has %d", len(pod.Spec.Containers))
	case len(pod.Spec.InitContainers) > 0:
		return unsupported("the kubetest agent runs no init containers; this pod has %d", len(pod.Spec.InitContainers))
	case len(pod.Spec.EphemeralContainers) > 0:
		return unsupported("the kubetest agent runs no ephemeral containers")
	}
	return nil
}

// envVar is one variable of a container's environment.
type envVar struct{ name, value string }

// envList is an environment in order of first definition, where a later definition of a name
// replaces the value in place.
type envList struct {
	vars  []envVar
	index map[string]int
}

func (l *envList) set(name, value string) {
	if l.index == nil {
		l.index = make(map[string]int)
	}
	if i, ok := l.index[name]; ok {
		l.vars[i].value = value
		return
	}
	l.index[name] = len(l.vars)
	l.vars = append(l.vars, envVar{name, value})
}

func (l *envList) lookup(name string) (string, bool) {
	i, ok := l.index[name]
	if !ok {
		return "", false
	}
	return l.vars[i].value, true
}

// environ returns the list as NAME=value strings, for exec.
func (l *envList) environ() []string {
	out := make([]string, len(l.vars))
	for i, v := range l.vars {
		out[i] = v.name + "=" + v.value
	}
	return out
}

// expand replaces each $(NAME) in s with lookup's value for NAME, as the kubelet expands a
// container's command, args and env values: a NAME that lookup does not know stays $(NAME) as
// written, $$ is a literal $ (so $$(NAME) gives $(NAME)), and any other $ stays as it is.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// lookups returns a lookup that tries each list in turn.
func lookups(lists ...*envList) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for _, l := range lists {
			if v, ok := l.lookup(name); ok {
				return v, true
			}
		}
		return "", false
	}
}

// serviceEnv returns the variables a kubelet gives every container for the cluster's
// kubernetes Service, here the apiserver itself on 127.0.0.1.
func serviceEnv(apiPort string) *envList {
	var l envList
	l.set("KUBERNETES_SERVICE_HOST", hostIP)
	l.set("KUBERNETES_SERVICE_PORT", apiPort)
	l.set("KUBERNETES_SERVICE_PORT_HTTPS", apiPort)
	l.set("KUBERNETES_PORT", "tcp://"+hostIP+":"+apiPort)
	return &l
}

// objectSource reads the Secrets and ConfigMaps that a pod's env and volumes name.
type objectSource interface {
	secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	configMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
}

// containerEnv resolves the environment the kubelet gives container c of pod, in the
// kubelet's order: each envFrom source, then each env entry (a value expanded with the
// variables defined before it and the service variables), then the service variables the
// container did not set. A Secret, ConfigMap or key that is missing and not optional refuses
// the container with CreateContainerConfigError.
func containerEnv(ctx context.Context, src objectSource, pod *corev1.Pod, c *corev1.Container, service *envList, capacity corev1.ResourceList) (*envList, *refusal) {
	var env envList
	ns := pod.Namespace
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := src.configMap(ctx, ns, from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && optional(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, objectError(err, "configmap", from.ConfigMapRef.Name)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := src.secret(ctx, ns, from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && optional(from.SecretRef.Optional) {
					continue
				}
				return nil, objectError(err, "secret", from.SecretRef.Name)
			}
			data = make(map[string]string, len(s.Data))
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			name := from.Prefix + k
			if len(validation.IsEnvVarName(name)) > 0 {
				continue // the kubelet skips it too, with an event
			}
			env.set(name, data[k])
		}
	}
	for _, e := range c.Env {
		value := e.Value
		switch {
		case value != "":
			value = expand(value, lookups(&env, service))
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, unsupported("env %s: %v", e.Name, err)
			}
			value = v
		case e.ValueFrom.ResourceFieldRef != nil:
			v, err := resourceValue(c, e.ValueFrom.ResourceFieldRef, capacity)
			if err != nil {
				return nil, unsupported("env %s: %v", e.Name, err)
			}
			value = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, err := src.configMap(ctx, ns, ref.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && optional(ref.Optional) {
					continue
				}
				return nil, objectError(err, "configmap", ref.Name)
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				if optional(ref.Optional) {
					continue
				}
				return nil, configError("couldn't find key %s in ConfigMap %s/%s", ref.Key, ns, ref.Name)
			}
			value = v
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, err := src.secret(ctx, ns, ref.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && optional(ref.Optional) {
					continue
				}
				return nil, objectError(err, "secret", ref.Name)
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				if optional(ref.Optional) {
					continue
				}
				return nil, configError("couldn't find key %s in Secret %s/%s", ref.Key, ns, ref.Name)
			}
			value = string(v)
		default:
			return nil, unsupported("env %s: the kubetest agent does not resolve this valueFrom", e.Name)
		}
		env.set(e.Name, value)
	}
	for _, v := range service.vars {
		if _, ok := env.lookup(v.name); !ok {
			env.set(v.name, v.value)
		}
	}
	return &env, nil
}

func optional(p *bool) bool { return p != nil && *p }

// objectError is the refusal for a Secret or ConfigMap that could not be read.
func objectError(err error, kind, name string) *refusal {
	if apierrors.IsNotFound(err) {
		return configError("%s %q not found", kind, name)
	}
	return configError("read %s %q: %v", kind, name, err)
}

// fieldValue resolves a downward API field of pod, as in an env var's or a downwardAPI
// volume's fieldRef.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return PodIP(pod.Namespace, pod.Name), nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if rest, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m[key], nil
			}
		}
	}
	return "", fmt.Errorf("field path %q is not supported", path)
}

// formatMap formats labels or annotations as a downwardAPI volume's file holds them: one
// key="value" per line, in the order of the keys.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	lines := make([]string, len(keys))
	for i, k := range keys {
		lines[i] = k + "=" + strconv.Quote(m[k])
	}
	return strings.Join(lines, "\n")
}

// resourceValue resolves a resourceFieldRef of container c: its limit or request divided by
// the divisor (1 when unset) and rounded up, as the kubelet does. An unset limit is the node's
// capacity, as the kubelet takes its allocatable resources.
func resourceValue(c *corev1.Container, ref *corev1.ResourceFieldSelector, capacity corev1.ResourceList) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		return "", fmt.Errorf("resourceFieldRef names container %q, not %q", ref.ContainerName, c.Name)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || kind != "limits" && kind != "requests" {
		return "", fmt.Errorf("resource %q is not supported", ref.Resource)
	}
	rn := corev1.ResourceName(name)
	switch rn {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
	default:
		return "", fmt.Errorf("resource %q is not supported", ref.Resource)
	}
	var q resource.Quantity
	if kind == "limits" {
		v, ok := c.Resources.Limits[rn]
		if !ok {
			v = capacity[rn]
		}
		q = v
	} else {
		q = c.Resources.Requests[rn]
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	var n, d int64
	if rn == corev1.ResourceCPU {
		n, d = q.MilliValue(), divisor.MilliValue()
	} else {
		n, d = q.Value(), divisor.Value()
	}
	if d <= 0 {
		return "", fmt.Errorf("divisor %s of %s is not positive", divisor.String(), ref.Resource)
	}
	return strconv.FormatInt(ceilDiv(n, d), 10), nil
}

func ceilDiv(n, d int64) int64 {
	if n <= 0 {
		return n / d
	}
	return (n + d - 1) / d
}

// commandLine returns the arguments that follow the image's entrypoint binary: Command[1:] and
// Args when Command is set (Command[0] names the image's entrypoint, which Images maps to a
// binary), else Args, each expanded with env.
func commandLine(c *corev1.Container, env *envList) []string {
	var args []string
	if len(c.Command) > 0 {
		args = append(args, c.Command[1:]...)
	}
	args = append(args, c.Args...)
	for i, a := range args {
		args[i] = expand(a, env.lookup)
	}
	return args
}

// apiObjects reads Secrets and ConfigMaps through the control plane's administrator client.
type apiObjects struct{ cp *ControlPlane }

func (a apiObjects) secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return a.cp.Client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (a apiObjects) configMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return a.cp.Client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}
