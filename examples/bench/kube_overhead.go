package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
)

// scalerOverhead measures, once each, the two ways a server's pod comes to run on the node:
//
//   - subject: a new kube.Scaler (its informer synced beforehand, as a coordinator's is) is
//     given a plan of one server; from the Scale call to the pod Running as the apiserver says;
//   - baseline: the very pod the scaler made (spec, resources, environment, arguments), created
//     again directly under another name: from the create call to the pod Running. What is left
//     is the node agent's start of the process, the scheduler and the apiserver.
//
// Both Running times are read the same way (WaitPod on the pod's name).
func (j *kubeJob) scalerOverhead(ctx context.Context, round int) (scaler, bare time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, kubeWaitFor)
	defer cancel()
	name := "ovh" + strconv.Itoa(round)
	spec := j.podSpec(nil)
	tmpl := corev1.PodTemplateSpec{Spec: spec}
	s, err := kube.New(ctx, kube.Config{
		Client: j.cp.Client, Namespace: j.ns, Job: name, Template: tmpl, Port: 7070, StopGrace: time.Second,
		Secret: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: kubeSecret}, Key: "secret"},
		Args: func(l kube.Launch) []string {
			return append([]string{"-role=ps", "-id=" + l.ID, "-listen=$(POD_IP):7070", "-servers=" + l.ID + "=" + l.Addr}, kubeDataFlags...)
		},
	})
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	podName := kube.PodName(name, elastic.ServerID(0))
	start := time.Now()
	if err := s.Scale(ctx, elastic.Plan{Servers: 1, Server: elastic.Resources{Memory: j.psBytes()}}); err != nil {
		return 0, 0, fmt.Errorf("scale to one server: %w", err)
	}
	made, err := j.cp.WaitPod(ctx, j.ns, podName, running)
	if err != nil {
		return 0, 0, err
	}
	scaler = time.Since(start)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-bare", Labels: map[string]string{"bench": "bare"}},
		Spec:       *made.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "" // the scheduler places it, as it placed the scaler's
	pod.Spec.Hostname = pod.Name
	pods := j.cp.Client.CoreV1().Pods(j.ns)
	start = time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, 0, err
	}
	if _, err := j.cp.WaitPod(ctx, j.ns, pod.Name, running); err != nil {
		return 0, 0, err
	}
	bare = time.Since(start)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		return 0, 0, err
	}
	return scaler, bare, nil
}

func running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }
