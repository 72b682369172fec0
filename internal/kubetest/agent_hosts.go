package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
	corev1 "k8s.io/api/core/v1"
)

// hostIP is the address of every node, as AddNode registers it.
const hostIP = "127.0.0.1"

// clusterDomain is the DNS domain of the cluster, as a kubelet's --cluster-domain.
const clusterDomain = "cluster.local"

// PodIP returns the address that node agents give pod namespace/name: an address of 127.0.0.0/8
// chosen by a hash of the two, outside 127.0.0.0/16 (so never 127.0.0.1, where the control plane
// listens) and never ending in .0 or .255. A pod recreated under the same name gets the same
// address again, as a StatefulSet's pod keeps its DNS name. Any such address can be bound and
// reached on Linux's loopback interface with no setup.
//
// Two names may hash to the same address (one in about 16.5 million); an agent fails the later
// of two live pods that would share one, with reason PodIPCollision.
func PodIP(namespace, name string) string {
	const (
		second = 255 // 1..255
		third  = 256 // 0..255
		fourth = 254 // 1..254
	)
	v := xxhash.Sum64String(namespace + "/" + name)
	a := 1 + v%second
	v /= second
	b := v % third
	v /= third
	c := 1 + v%fourth
	return fmt.Sprintf("127.%d.%d.%d", a, b, c)
}

// podHostname returns the host name a pod's process sees: spec.hostname, else the pod's name cut
// to 63 characters, as a kubelet does.
func podHostname(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	name := pod.Name
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-.")
	}
	return name
}

// hostsLine returns the hosts file line for pod, or "" if it has none: the names of a pod with
// spec.hostname and spec.subdomain (hostname.subdomain.namespace.svc.cluster.local and
// hostname.subdomain.namespace.svc), and, for a pod of this node (local), its own host name.
func hostsLine(pod *corev1.Pod, local bool) string {
	var names []string
	if pod.Spec.Hostname != "" && pod.Spec.Subdomain != "" {
		svc := pod.Spec.Hostname + "." + pod.Spec.Subdomain + "." + pod.Namespace + ".svc"
		names = append(names, svc+"."+clusterDomain, svc)
	}
	if local {
		names = append(names, podHostname(pod))
	}
	if len(names) == 0 {
		return ""
	}
	return PodIP(pod.Namespace, pod.Name) + "\t" + strings.Join(names, " ")
}

// hostsFile is a node's hosts file, which its pods see as /etc/hosts. It is rewritten in place,
// the same inode, so that the bind mounts of running pods see each change. Only the informer's
// handler goroutine uses it once the node runs.
type hostsFile struct {
	path    string
	header  string
	lines   map[string]string // "namespace/name/uid" -> line
	written []byte
}

func newHostsFile(path, node string) (*hostsFile, error) {
	h := &hostsFile{
		path: path,
		header: "# Kubernetes-managed hosts file, written by the kubetest agent of node " + node + ".\n" +
			"127.0.0.1\tlocalhost\n" +
			"::1\tlocalhost ip6-localhost ip6-loopback\n",
		lines: make(map[string]string),
	}
	if err := h.flush(); err != nil {
		return nil, err
	}
	return h, nil
}

// set records key's line ("" removes it) and rewrites the file if its content changed.
func (h *hostsFile) set(key, line string) error {
	if line == "" {
		if _, ok := h.lines[key]; !ok {
			return nil
		}
		delete(h.lines, key)
	} else {
		if h.lines[key] == line {
			return nil
		}
		h.lines[key] = line
	}
	return h.flush()
}

// content returns the file's text: the header, then the lines in the order of their keys.
func (h *hostsFile) content() []byte {
	keys := make([]string, 0, len(h.lines))
	for k := range h.lines {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b bytes.Buffer
	b.WriteString(h.header)
	for _, k := range keys {
		b.WriteString(h.lines[k])
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// flush writes the content over the file from its start and then cuts it to length, so that a
// reader meanwhile sees the old text or the new one, perhaps with a stale tail, but never an
// empty file.
func (h *hostsFile) flush() error {
	b := h.content()
	if bytes.Equal(b, h.written) {
		return nil
	}
	f, err := os.OpenFile(h.path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		err = f.Truncate(int64(len(b)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("hosts file: %w", err)
	}
	h.written = b
	return nil
}
