package kube_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
)

// coordinatorPod is a coordinator's pod as a Job's controller and the apiserver make it.
func coordinatorPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "dlrm-x7k2p", Namespace: "train",
			Labels: map[string]string{kube.LabelJob: "dlrm", kube.LabelRole: "coordinator", "team": "ads",
				"batch.kubernetes.io/job-name": "dlrm", "batch.kubernetes.io/controller-uid": "u1", "job-name": "dlrm", "controller-uid": "u1"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "dlrm", UID: "u1",
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-3", Hostname: "coordinator", Subdomain: "dlrm", ServiceAccountName: "elasticps",
			NodeSelector: map[string]string{"pool": "train"},
			Containers: []corev1.Container{{
				Name: "dlrm", Image: "elasticps/dlrm:dev",
				Args:           []string{"-role=coordinator", "-kube"},
				Ports:          []corev1.ContainerPort{{Name: "control", ContainerPort: 7071}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}},
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "ELASTICPS_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "elasticps"}, Key: "secret"}}},
					{Name: "GOGC", Value: "200"},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "checkpoints", MountPath: "/mnt"}, {Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}},
			}},
			Volumes: []corev1.Volume{{Name: "checkpoints"}, {Name: "kube-api-access-abcde"}},
		},
	}
}

// A coordinator's pod gives the template of its job's pods: its own settings, less what is its
// alone, and an owner that deletes them with the Job but is not their controller.
func TestFromPodKeepsTheJobsSettingsAndDropsTheCoordinators(t *testing.T) {
	pod := coordinatorPod()
	self, err := kube.FromPod(pod, "")
	require.NoError(t, err)
	assert.Equal(t, "dlrm", self.Job)
	assert.Equal(t, "train", self.Namespace)
	assert.Equal(t, "dlrm", self.Container)
	assert.Equal(t, "elasticps", self.Secret.Name)
	assert.Equal(t, "secret", self.Secret.Key)
	require.NotNil(t, self.Owner)
	assert.Equal(t, metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "dlrm", UID: "u1"}, *self.Owner,
		"the Job owns the pods, but does not control them: its controller must not count them as its own")

	tmpl := self.Template
	assert.Equal(t, map[string]string{kube.LabelJob: "dlrm", "team": "ads"}, tmpl.Labels, "no Job controller label, no role")
	spec := tmpl.Spec
	assert.Empty(t, spec.NodeName)
	assert.Empty(t, spec.Hostname)
	assert.Empty(t, spec.Subdomain)
	assert.Equal(t, "elasticps", spec.ServiceAccountName)
	assert.Equal(t, map[string]string{"pool": "train"}, spec.NodeSelector)
	c := spec.Containers[0]
	assert.Equal(t, "elasticps/dlrm:dev", c.Image)
	assert.Empty(t, c.Args, "the coordinator's role flags are its own")
	assert.Empty(t, c.Ports)
	assert.Nil(t, c.ReadinessProbe, "the probe is of the coordinator's port")
	assert.Equal(t, []corev1.EnvVar{{Name: "GOGC", Value: "200"}}, c.Env, "the scaler sets the secret and the pod's own variables")
	assert.Equal(t, []corev1.VolumeMount{{Name: "checkpoints", MountPath: "/mnt"}}, c.VolumeMounts)
	assert.Equal(t, []corev1.Volume{{Name: "checkpoints"}}, spec.Volumes, "the apiserver adds each pod's service-account volume")
	assert.Equal(t, "coordinator", pod.Spec.Hostname, "the pod read is not changed")
	assert.Len(t, pod.Spec.Containers[0].Env, 3)

	addr, err := self.Addr("", 7071)
	require.NoError(t, err)
	assert.Equal(t, "coordinator.dlrm.train.svc.cluster.local:7071", addr)
}

func TestFromPodRefusesAPodThatCannotLeadAJob(t *testing.T) {
	pod := coordinatorPod()
	pod.Labels = nil
	pod.OwnerReferences = nil
	pod.Spec.Containers[0].Env = nil
	_, err := kube.FromPod(pod, "")
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig)
	assert.ErrorContains(t, err, "no label elasticps.io/job")
	assert.ErrorContains(t, err, "does not get ELASTICPS_SECRET from a Secret")

	_, err = kube.FromPod(coordinatorPod(), "other")
	assert.ErrorContains(t, err, `no container "other"`)

	pod = coordinatorPod()
	pod.Spec.Hostname = ""
	self, err := kube.FromPod(pod, "dlrm")
	require.NoError(t, err)
	_, err = self.Addr("", 7071)
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig, "no name that outlives the pod")
}
