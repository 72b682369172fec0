package kubetest

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Client rate limits: well above client-go's defaults (5/s, burst 10), which would make a
// test that creates a few dozen objects wait on itself.
const (
	clientQPS   = 200
	clientBurst = 400
)

// ConfigFor returns a client config for the apiserver that authenticates with token, a static
// token or one from TokenFor.
func (cp *ControlPlane) ConfigFor(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS:             clientQPS,
		Burst:           clientBurst,
	}
}

// WriteKubeconfig writes a kubeconfig file at path for a program under test (kubectl, a node
// agent): one cluster, one user and one current context. An empty token writes the
// administrator's. The file holds the CA certificate inline, so it outlives nothing but the
// control plane.
func (cp *ControlPlane) WriteKubeconfig(path, token string) error {
	if token == "" {
		token = cp.Config.BearerToken
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.caPEM}
	cfg.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	cfg.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubetest: write kubeconfig: %w", err)
	}
	return nil
}

// tokenLifetime is how long a token from TokenFor is valid: longer than any test.
const tokenLifetime = 2 * 60 * 60 // seconds

// TokenFor returns a bearer token for ServiceAccount serviceAccount in namespace, issued by the
// TokenRequest API as a kubelet would for a pod, valid for two hours. The ServiceAccount must
// exist. With ConfigFor it gives a client that can do what the account's Roles allow and no more.
func (cp *ControlPlane) TokenFor(ctx context.Context, serviceAccount, namespace string) (string, error) {
	exp := int64(tokenLifetime)
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}},
		metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kubetest: token for %s/%s: %w", namespace, serviceAccount, err)
	}
	return tr.Status.Token, nil
}
