package kubetest

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podView is what a node agent reports of its pod: the status fields a kubelet owns. apply
// writes it into the pod's status; other fields (PodScheduled, qosClass) stay as they are.
type podView struct {
	phase           corev1.PodPhase
	reason, message string
	startTime       *metav1.Time
	sandbox         bool // the pod has its address and files (PodReadyToStartContainers)
	hasIP           bool // it has had an address; it keeps it in its status once terminal
	ended           bool
	container       *corev1.ContainerStatus // nil before the agent has said anything of it

	// The container's latest termination, and the one before.
	last, previous *corev1.ContainerStateTerminated
}

func (v *podView) ensureContainer(pod *corev1.Pod) {
	if v.startTime == nil {
		now := metav1.Now()
		v.startTime = &now
	}
	if v.container == nil {
		c := pod.Spec.Containers[0]
		v.container = &corev1.ContainerStatus{Name: c.Name, Image: c.Image}
	}
}

// waiting reports a container that does not start now for r; a pod that has not run is
// Pending.
func (v *podView) waiting(pod *corev1.Pod, r *refusal, ran bool) {
	v.ensureContainer(pod)
	if !ran {
		v.phase = corev1.PodPending
	}
	// Volumes and the address come before the sandbox; an image or a config error after it.
	v.sandbox = r.reason != "ContainerCreating"
	v.hasIP = v.hasIP || v.sandbox
	c := v.container
	c.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: r.reason, Message: r.message}}
	c.LastTerminationState = lastState(v.last)
	c.Ready = false
	c.Started = ptr(false)
}

// running reports the container started as p, the image's binary, and whether it is ready.
func (v *podView) running(pod *corev1.Pod, p *podProcess, binary string, ready bool) {
	v.ensureContainer(pod)
	v.phase = corev1.PodRunning
	v.reason, v.message = "", ""
	v.sandbox, v.hasIP = true, true
	c := v.container
	c.ImageID = "kubetest://" + binary
	c.ContainerID = p.containerID()
	c.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: p.started}}
	c.LastTerminationState = lastState(v.last)
	c.Ready = ready
	c.Started = ptr(true)
}

// exited records the container's end.
func (v *podView) exited(pod *corev1.Pod, t *corev1.ContainerStateTerminated) {
	v.ensureContainer(pod) // a container that never started has said nothing yet
	v.previous, v.last = v.last, t
}

// crashLoop reports the container waiting delay before its restart.
func (v *podView) crashLoop(pod *corev1.Pod, delay time.Duration) {
	c := v.container
	c.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason:  "CrashLoopBackOff",
		Message: fmt.Sprintf("back-off %v restarting failed container=%s pod=%s_%s(%s)", delay, c.Name, pod.Name, pod.Namespace, pod.UID),
	}}
	c.LastTerminationState = lastState(v.last)
	c.Ready = false
	c.Started = ptr(false)
}

// terminal reports the pod ended after its container's last exit: Succeeded if it exited 0,
// Failed otherwise.
func (v *podView) terminal() {
	v.ended = true
	v.sandbox = false
	v.phase = corev1.PodFailed
	if v.last != nil && v.last.ExitCode == 0 {
		v.phase = corev1.PodSucceeded
	}
	if c := v.container; c != nil {
		if v.last != nil {
			c.State = corev1.ContainerState{Terminated: v.last}
		}
		c.LastTerminationState = lastState(v.previous)
		c.Ready = false
		c.Started = ptr(false)
	}
}

// refused reports the pod failed for good before its container could run.
func (v *podView) refused(r *refusal) {
	v.ended = true
	v.sandbox = false
	v.phase = corev1.PodFailed
	v.reason, v.message = r.reason, r.message
	if v.startTime == nil {
		now := metav1.Now()
		v.startTime = &now
	}
	if c := v.container; c != nil {
		c.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: r.reason, Message: r.message}}
		c.Ready = false
	}
}

func lastState(t *corev1.ContainerStateTerminated) corev1.ContainerState {
	if t == nil {
		return corev1.ContainerState{}
	}
	return corev1.ContainerState{Terminated: t.DeepCopy()}
}

func ptr[T any](v T) *T { return &v }

// apply writes the view into s, the status of pod namespace/name, at time now.
func (v *podView) apply(s *corev1.PodStatus, namespace, name string, now metav1.Time) {
	s.Phase = v.phase
	s.Reason, s.Message = v.reason, v.message
	if v.startTime != nil && s.StartTime == nil {
		s.StartTime = v.startTime.DeepCopy()
	}
	s.HostIP = hostIP
	s.HostIPs = []corev1.HostIP{{IP: hostIP}}
	if v.hasIP {
		ip := PodIP(namespace, name)
		s.PodIP = ip
		s.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	if v.container == nil {
		return
	}
	setCondition(s, corev1.PodReadyToStartContainers, v.sandbox, "", "", now)
	setCondition(s, corev1.PodInitialized, true, "", "", now)
	ready := v.container.Ready
	reason, message := "", ""
	switch {
	case ready:
	case v.ended:
		reason = "PodCompleted"
	default:
		reason, message = "ContainersNotReady", "containers with unready status: ["+v.container.Name+"]"
	}
	setCondition(s, corev1.ContainersReady, ready, reason, message, now)
	setCondition(s, corev1.PodReady, ready, reason, message, now)
	s.ContainerStatuses = []corev1.ContainerStatus{*v.container.DeepCopy()}
}

// setCondition sets condition t of s, keeping its transition time unless its status changes.
func setCondition(s *corev1.PodStatus, t corev1.PodConditionType, ok bool, reason, message string, now metav1.Time) {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	for i := range s.Conditions {
		c := &s.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != status {
			c.Status = status
			c.LastTransitionTime = now
		}
		c.Reason, c.Message = reason, message
		return
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: message, LastTransitionTime: now})
}
