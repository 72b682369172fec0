package kube

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/elasticps/elasticps/elastic"
)

// EventKind is what happened to a pod.
type EventKind uint8

// The kinds of Event. EventRunning and EventPending are about a pod that lives on; the others
// are its end.
const (
	// EventPending: the pod stayed unscheduled longer than Config.PendingTimeout; Reason and
	// Message are the scheduler's (PodScheduled condition). The pod is deleted, and its start
	// fails with ErrPending.
	EventPending EventKind = iota + 1
	// EventRunning: the pod's container runs.
	EventRunning
	// EventExited: the container exited by itself; ExitCode says how (0: done).
	EventExited
	// EventOOMKilled: the container was killed for going over its memory limit (MemoryLimit).
	EventOOMKilled
	// EventEvicted: the pod was evicted (node pressure, the eviction API, a taint).
	EventEvicted
	// EventPreempted: the scheduler deleted the pod to make room for one of higher priority.
	EventPreempted
	// EventDeleted: the pod was deleted behind the scaler's back.
	EventDeleted
	// EventStopped: the scaler deleted the pod (Scale, StopServers, Close), and it is gone.
	EventStopped
	// EventRefused: the apiserver refused to create the pod; Message is its error (an
	// exceeded ResourceQuota, a missing service account, RBAC). The start fails with it.
	EventRefused
	// EventUnschedulable: the scheduler found no node for the pod; Reason and Message are its
	// words ("Unschedulable", "0/3 nodes are available: 3 Insufficient memory."). Once per
	// pod, as soon as the scheduler says so: the pod lives on and waits, and Scaler.Pending
	// lists it, for an autoscaler to ask for it smaller (Scale) before PendingTimeout fails it.
	EventUnschedulable
)

// String returns the kind's name: "Pending", "Running", "Exited", "OOMKilled", "Evicted",
// "Preempted", "Deleted", "Stopped", "Refused" or "Unschedulable".
func (k EventKind) String() string {
	switch k {
	case EventPending:
		return "Pending"
	case EventRunning:
		return "Running"
	case EventExited:
		return "Exited"
	case EventOOMKilled:
		return "OOMKilled"
	case EventEvicted:
		return "Evicted"
	case EventPreempted:
		return "Preempted"
	case EventDeleted:
		return "Deleted"
	case EventStopped:
		return "Stopped"
	case EventRefused:
		return "Refused"
	case EventUnschedulable:
		return "Unschedulable"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is a change of a pod of a Scaler (Config.OnEvent): it runs, it stays pending, it ended.
// An autoscaler reads the ends: an OOM kill asks for more memory, a pending pod for a smaller
// request or a bigger cluster.
type Event struct {
	// Launch is the start the pod was made for.
	Launch
	// Pod and UID name the pod.
	Pod string
	UID types.UID
	// Kind is what happened.
	Kind EventKind
	// ExitCode is the container's exit code when it terminated (137 for a kill), else 0.
	ExitCode int32
	// Reason and Message say why, in Kubernetes' words: the container's termination reason
	// ("OOMKilled", "Error"), the pod's status reason ("Evicted") or the condition's (the
	// scheduler's "Unschedulable" with "0/3 nodes are available: 3 Insufficient memory.").
	Reason, Message string
	// MemoryLimit is the pod's memory limit in bytes (0: none): at an OOM kill, the limit it
	// went over.
	MemoryLimit int64
	// Final says the node id gets no other pod: it is done (status 0), stopped, at its restart
	// limit, or its start failed.
	Final bool
}

// Ended reports whether the event is the end of a pod that was created.
func (e Event) Ended() bool { return e.Kind >= EventExited && e.Kind <= EventStopped }

// Abnormal reports whether the event is an end that calls for a replacement: anything but an
// exit with status 0 or a stop by the scaler.
func (e Event) Abnormal() bool {
	return e.Ended() && e.Kind != EventStopped && (e.Kind != EventExited || e.ExitCode != 0)
}

// String describes the event for a log line or a Reporter: "pod j-ps-0 OOMKilled: exit code
// 137, memory limit 64Mi".
func (e Event) String() string {
	s := fmt.Sprintf("pod %s %s", e.Pod, e.Kind)
	var detail []string
	if e.Kind == EventExited || e.Kind == EventOOMKilled || e.ExitCode != 0 {
		detail = append(detail, fmt.Sprintf("exit code %d", e.ExitCode))
	}
	if e.Reason != "" && e.Reason != e.Kind.String() {
		detail = append(detail, e.Reason)
	}
	if e.Message != "" {
		detail = append(detail, e.Message)
	}
	if e.Kind == EventOOMKilled && e.MemoryLimit > 0 {
		detail = append(detail, "memory limit "+resource.NewQuantity(e.MemoryLimit, resource.BinarySI).String())
	}
	for i, d := range detail {
		if i == 0 {
			s += ": " + d
		} else {
			s += ", " + d
		}
	}
	return s
}

// PodStatus is a node id of a Scaler and its newest pod (Scaler.Pods).
type PodStatus struct {
	// Role and ID are the node id's.
	Role elastic.Role
	ID   string
	// Pod and UID name the newest pod ("" before the first is created).
	Pod string
	UID types.UID
	// Phase is the newest pod's phase as last seen ("" before it is seen).
	Phase corev1.PodPhase
	// Restarts counts the replacement pods.
	Restarts int
	// Size is the newest pod's size (Launch.Size), from when it is on its way.
	Size elastic.Resources
	// Resize is the size the newest pod is to be asked for again at (zero: none): a restart
	// asked for (RestartServer), or a still-pending pod of a role whose size a Scale changed,
	// and not yet carried out.
	Resize elastic.Resources
	// Running says the newest pod's container runs.
	Running bool
	// Done says the node id gets no other pod.
	Done bool
	// Last is the newest end of a pod of the node id (Kind 0: none yet).
	Last Event
	// Err is why the node id is done, once Done: nil after an exit with status 0, else an error
	// wrapping ErrRestartLimit, ErrPending, ErrStopped or the failure to create the pod.
	Err error
}

// Condition types and reasons of a disruption (k8s.io/api names the type only).
const (
	reasonPreempted = "PreemptionByScheduler"
	reasonEvicted   = "Evicted"
	reasonOOMKilled = "OOMKilled"
)

// endOf classifies the end of pod p of container c from its last state; deleted says it is
// gone from the apiserver without the scaler deleting it (or the scaler saw it ending first).
func endOf(p *corev1.Pod, c string, deleted bool) Event {
	ev := Event{Pod: p.Name, UID: p.UID, MemoryLimit: memoryLimit(p, c)}
	term := terminated(p, c)
	if term != nil {
		ev.ExitCode, ev.Reason, ev.Message = term.ExitCode, term.Reason, term.Message
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue {
			ev.Kind, ev.Reason, ev.Message = EventEvicted, cond.Reason, cond.Message
			if cond.Reason == reasonPreempted {
				ev.Kind = EventPreempted
			}
			return ev
		}
	}
	switch {
	case p.Status.Reason == reasonEvicted:
		ev.Kind, ev.Reason, ev.Message = EventEvicted, p.Status.Reason, p.Status.Message
	case term != nil && term.Reason == reasonOOMKilled:
		ev.Kind = EventOOMKilled
	case deleted && (p.DeletionTimestamp != nil || !terminal(p)):
		ev.Kind = EventDeleted
	default:
		ev.Kind = EventExited
		if term == nil && p.Status.Phase == corev1.PodFailed {
			ev.ExitCode, ev.Reason, ev.Message = -1, p.Status.Reason, p.Status.Message // failed with no container status
		}
	}
	return ev
}

// terminal reports whether p has ended (phase Failed or Succeeded).
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

// status returns container c's status in p, or nil.
func status(p *corev1.Pod, c string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == c {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// running reports whether container c of p runs.
func running(p *corev1.Pod, c string) bool {
	cs := status(p, c)
	return p.Status.Phase == corev1.PodRunning && cs != nil && cs.State.Running != nil
}

// terminated returns container c's termination, or nil.
func terminated(p *corev1.Pod, c string) *corev1.ContainerStateTerminated {
	if cs := status(p, c); cs != nil {
		if cs.State.Terminated != nil {
			return cs.State.Terminated
		}
		return cs.LastTerminationState.Terminated
	}
	return nil
}

// memoryLimit returns container c's memory limit in p, in bytes (0: none).
func memoryLimit(p *corev1.Pod, c string) int64 {
	for _, ct := range p.Spec.Containers {
		if ct.Name == c {
			if q, ok := ct.Resources.Limits[corev1.ResourceMemory]; ok {
				return q.Value()
			}
		}
	}
	return 0
}

// unscheduled returns p's PodScheduled condition when the scheduler found no node for it.
func unscheduled(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		c := &p.Status.Conditions[i]
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c
		}
	}
	return nil
}
