package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
)

// endOf reads how a pod ended from the status a kubelet, the scheduler or the eviction API
// leaves on it.
func TestEndOf(t *testing.T) {
	pod := func(phase corev1.PodPhase, term *corev1.ContainerStateTerminated) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-ps-0", UID: "u1"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}}}},
			Status: corev1.PodStatus{Phase: phase}}
		if term != nil {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: term}}}
		}
		return p
	}
	crashed := pod(corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"})
	oom := pod(corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"})
	done := pod(corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	evicted := pod(corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"})
	evicted.Status.Reason, evicted.Status.Message = "Evicted", "The node was low on resource: memory."
	preempted := pod(corev1.PodRunning, nil)
	preempted.DeletionTimestamp = new(metav1.Now())
	preempted.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: "PreemptionByScheduler", Message: "Preempted by pod x"}}
	drained := pod(corev1.PodRunning, nil)
	drained.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI"}}
	deleted := pod(corev1.PodRunning, nil)
	deleted.DeletionTimestamp = new(metav1.Now())
	noStatus := pod(corev1.PodFailed, nil)

	for _, c := range []struct {
		name     string
		p        *corev1.Pod
		deleted  bool
		kind     EventKind
		code     int32
		reason   string
		abnormal bool
		text     string
	}{
		{"crash", crashed, false, EventExited, 137, "Error", true, "pod j-ps-0 Exited: exit code 137, Error"},
		{"oom", oom, false, EventOOMKilled, 137, "OOMKilled", true, "pod j-ps-0 OOMKilled: exit code 137, memory limit 64Mi"},
		{"done", done, false, EventExited, 0, "Completed", false, "pod j-ps-0 Exited: exit code 0, Completed"},
		{"evicted", evicted, false, EventEvicted, 137, "Evicted", true, "pod j-ps-0 Evicted: exit code 137, The node was low on resource: memory."},
		{"preempted", preempted, true, EventPreempted, 0, "PreemptionByScheduler", true, "pod j-ps-0 Preempted: PreemptionByScheduler, Preempted by pod x"},
		{"drained", drained, true, EventEvicted, 0, "EvictionByEvictionAPI", true, "pod j-ps-0 Evicted: EvictionByEvictionAPI"},
		{"deleted", deleted, true, EventDeleted, 0, "", true, "pod j-ps-0 Deleted"},
		{"gone after a crash", crashed, true, EventExited, 137, "Error", true, "pod j-ps-0 Exited: exit code 137, Error"},
		{"failed with no container status", noStatus, false, EventExited, -1, "", true, "pod j-ps-0 Exited: exit code -1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := endOf(c.p, "main", c.deleted)
			assert.Equal(t, c.kind, ev.Kind)
			assert.Equal(t, c.code, ev.ExitCode)
			assert.Equal(t, c.reason, ev.Reason)
			assert.Equal(t, int64(64<<20), ev.MemoryLimit)
			assert.Equal(t, c.abnormal, ev.Abnormal())
			assert.True(t, ev.Ended())
			assert.Equal(t, c.text, ev.String())
		})
	}
	assert.False(t, Event{Kind: EventStopped}.Abnormal(), "a stop is no failure")
	assert.False(t, Event{Kind: EventRunning}.Ended())
}

// An OOM-killed pod's replacement gets OOMGrowth times the limit it went over, capped.
func TestGrown(t *testing.T) {
	s := &Scaler{cfg: Config{OOMGrowth: 1.5, MaxMemory: 100 << 20}}
	assert.Equal(t, int64(96<<20), s.grown(sizeOfMemory(0), 64<<20).Memory)
	assert.Equal(t, int64(100<<20), s.grown(sizeOfMemory(0), 96<<20).Memory, "capped")
	assert.Equal(t, int64(200<<20), s.grown(sizeOfMemory(0), 200<<20).Memory, "never below the old limit")
	assert.Equal(t, int64(96<<20), s.grown(sizeOfMemory(64<<20), 0).Memory, "the plan's size without a limit on the pod")
	assert.Zero(t, s.grown(sizeOfMemory(0), 0).Memory, "no limit at all: nothing to grow")
}

func sizeOfMemory(m int64) elastic.Resources { return elastic.Resources{Memory: m} }
