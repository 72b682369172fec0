package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
)

func TestConfigValidate(t *testing.T) {
	err := kube.Config{Job: "Bad_Job", Port: 70000, MaxRestarts: -1, PendingTimeout: -time.Second, StopGrace: -time.Second,
		OOMGrowth: 0.5, MaxMemory: -1}.Validate()
	require.ErrorIs(t, err, elastic.ErrInvalidConfig)
	for _, want := range []string{"Client", "Namespace", "Job \"Bad_Job\"", "containers", "Args", "Port", "Secret", "MaxRestarts",
		"PendingTimeout", "StopGrace", "OOMGrowth", "MaxMemory"} {
		assert.ErrorContains(t, err, want)
	}
	ok := kube.Config{Client: &kubernetes.Clientset{}, Namespace: "ns", Job: "job",
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}},
		Args:     func(kube.Launch) []string { return nil },
		Secret:   corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}
	assert.ErrorContains(t, ok.Validate(), "name the program's (Container)")
	ok.Container = "c"
	assert.ErrorContains(t, ok.Validate(), `no container "c"`)
	ok.Container = "b"
	assert.NoError(t, ok.Validate())
	ok.Job = strings.Repeat("j", kube.MaxJobLen+1)
	assert.ErrorContains(t, ok.Validate(), "longer than")
	ok.Job = "1job"
	assert.ErrorIs(t, ok.Validate(), elastic.ErrInvalidConfig, "a Service name starts with a letter")
	_, err = kube.New(context.Background(), ok)
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig)
}

func TestServerAddr(t *testing.T) {
	assert.Equal(t, "train-ps-3.train.ads.svc.cluster.local:7070", kube.ServerAddr("train", "ads", "cluster.local", 3, 7070))
	assert.Equal(t, "train-worker-0", kube.PodName("train", elastic.WorkerID(0)))
	longest := kube.PodName(strings.Repeat("j", kube.MaxJobLen), elastic.WorkerID(99999999))
	assert.Len(t, longest, 63, "the longest pod name is a DNS label: its hostname")
}
