// Package kubetest runs a real Kubernetes control plane for tests: etcd, kube-apiserver,
// kube-scheduler and, when Options.Controllers names some, kube-controller-manager, as processes
// on loopback ports, with no kubelet.
//
// The binaries are built from the pinned module in tools/ by build-tools.sh, once, into a cache
// directory (see ToolsDir). A test that finds them missing is skipped, or fails when the
// environment says CI=true, with a message that names the script.
//
// What the absent components would do, the package does for them: it creates each namespace's
// default ServiceAccount (the controller manager's serviceaccount controller, which need not
// run), and AddNode registers a Node that is Ready and schedulable (a kubelet's job), so that the
// scheduler binds pods to it and reports why it cannot. A pod bound to such a node never runs; its spec.nodeName is the outcome a test watches
// for.
//
//	cp := kubetest.Start(t, kubetest.Options{Namespaces: []string{"train"}})
//	require.NoError(t, cp.AddNode(ctx, "node-1", corev1.ResourceList{
//		corev1.ResourceCPU:    resource.MustParse("4"),
//		corev1.ResourceMemory: resource.MustParse("8Gi"),
//	}))
//	pod, err := cp.Client.CoreV1().Pods("train").Create(ctx, somePod, metav1.CreateOptions{})
//	// ... cp.WaitPod(ctx, "train", pod.Name, kubetest.Scheduled)
//
// Start ties the control plane to one test; a Fixture shares one among the tests of a test
// binary, which is cheaper: a start costs a few seconds of two cores.
//
// The clients authenticate with static bearer tokens: Config and Client act as an administrator
// (group system:masters), the scheduler as system:kube-scheduler under the default RBAC roles, and
// TokenFor issues a ServiceAccount's token so that a test can act with only what a Role grants.
//
// # Node agents
//
// RunNode, or StartNode in a test, registers a node and runs an agent for it that does the rest
// of a kubelet's job: the pods bound to it run as local processes (a container image is a local
// binary, NodeOptions.Images), each with its own loopback address (PodIP), the names of the
// cluster's pods with a hostname and subdomain in its /etc/hosts, its ServiceAccount's token
// where rest.InClusterConfig looks for it, its volumes (emptyDir, of medium Memory a tmpfs of the
// pod's, hostPath, and persistentVolumeClaim bound to a directory of the machine that
// CreateHostPathVolume makes a PersistentVolume of, shared by the pods of every node), its memory
// and CPU limits in a cgroup, restarts by its restartPolicy, graceful deletion, and the status a
// kubelet writes, OOMKilled included. RunNode says where it differs from a kubelet. The agent
// needs Linux and root.
//
//	node := cp.StartNode(t, "node-1", kubetest.NodeOptions{
//		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
//		Images:   map[string]string{"example/dlrm": dlrmBinary},
//	})
//	// create pods of image example/dlrm with nodeSelector kubernetes.io/hostname=node-1, then
//	// cp.WaitPod(ctx, ns, name, ...), node.Logs(ns, name), node.Pid(ns, name)
//
// A ControlPlane's and a Node's methods are safe for concurrent use. Stop is idempotent.
package kubetest
