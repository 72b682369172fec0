// Package k8s_test checks the Kubernetes manifests of this directory against a real control plane
// (internal/kubetest): the apiserver accepts every one with strict server-side validation, and a
// job made from them trains to its end on nodes whose pods run as local processes.
package k8s_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/elasticps/elasticps/internal/kubetest"
)

// cluster is the control plane of this test binary, with the controllers a job needs: the
// garbage collector (the Job owns the job's pods and Service), the job controller (it runs the
// coordinator's pod) and the volume binder (the checkpoint claim).
var cluster = kubetest.Fixture{Options: kubetest.Options{
	Controllers:     []string{"garbage-collector-controller", "job-controller", "persistentvolume-binder-controller"},
	ControllerFlags: []string{"--pvclaimbinder-sync-period=1s"},
}}

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Stop()
	cleanBuild()
	os.Exit(code)
}

// manifest is one object of a manifest file.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func (m manifest) String() string { return m.file + ": " + m.obj.GetKind() + " " + m.obj.GetName() }

// readManifests returns every object of the directory's YAML files, in file order.
func readManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	require.NoError(t, err)
	slices.Sort(files)
	var out []manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, doc := range bytes.Split(data, []byte("\n---\n")) {
			js, err := yaml.YAMLToJSON(doc)
			require.NoError(t, err, f)
			if string(js) == "null" {
				continue
			}
			obj := &unstructured.Unstructured{}
			require.NoError(t, obj.UnmarshalJSON(js), f)
			out = append(out, manifest{file: f, obj: obj})
		}
	}
	require.NotEmpty(t, out)
	return out
}

// applier applies objects to a namespace of the control plane with server-side apply.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	ns     string
}

func newApplier(t *testing.T, cp *kubetest.ControlPlane, ns string) *applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.Config)
	require.NoError(t, err)
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.Client.Discovery())), ns: ns}
}

// apply applies obj with strict field validation: a field the apiserver does not know, or a
// value its schema refuses, is an error, as `kubectl apply --server-side` reports it.
func (a *applier) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", gvk, err)
	}
	js, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	_, err = a.dyn.Resource(mapping.Resource).Namespace(a.ns).Patch(ctx, obj.GetName(), types.ApplyPatchType, js,
		metav1.PatchOptions{FieldManager: "elasticps-test", Force: new(true), FieldValidation: "Strict"})
	return err
}

// Every manifest is accepted by the apiserver under strict validation; one with a misspelt
// field is refused, so the check can fail.
func TestManifestsPassServerSideValidation(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, cp.CreateNamespace(ctx, "manifests"))
	a := newApplier(t, cp, "manifests")
	kinds := map[string]bool{}
	for _, m := range readManifests(t) {
		assert.NoError(t, a.apply(ctx, m.obj), m.String())
		kinds[m.obj.GetKind()] = true
	}
	for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "Secret", "PersistentVolumeClaim", "Job"} {
		assert.True(t, kinds[k], "the manifests hold a %s", k)
	}

	for _, m := range readManifests(t) {
		if m.obj.GetKind() != "Job" {
			continue
		}
		bad := m.obj.DeepCopy()
		containers, _, _ := unstructured.NestedSlice(bad.Object, "spec", "template", "spec", "containers")
		containers[0].(map[string]any)["argz"] = []any{"-v"}
		require.NoError(t, unstructured.SetNestedSlice(bad.Object, containers, "spec", "template", "spec", "containers"))
		bad.SetName("misspelt")
		err := a.apply(ctx, bad)
		require.Error(t, err, "strict validation refuses an unknown field")
		assert.True(t, strings.Contains(err.Error(), "argz"), "the error names the field: %v", err)
	}
}
