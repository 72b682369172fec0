package kubetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// readiness is a container's readiness probe as the agent runs it: tcpSocket and httpGet
// (plain HTTP) probes, with the probe's delay, period, timeout and thresholds as a kubelet
// reads them. Exec and gRPC probes are not run: a container with one is ready once it runs,
// as is a container with no readiness probe. Liveness and startup probes are not run at all.
type readiness struct {
	probe *corev1.Probe
	addr  string // host:port
	path  string // for httpGet; "" for tcpSocket
	http  *http.Transport
}

// newReadiness returns the readiness probe of container c of a pod at address ip, or nil if the
// container is ready once it runs.
func newReadiness(c *corev1.Container, ip string) (*readiness, error) {
	p := c.ReadinessProbe
	if p == nil {
		return nil, nil
	}
	var port intstr.IntOrString
	host := ip
	r := &readiness{probe: p}
	switch {
	case p.TCPSocket != nil:
		port = p.TCPSocket.Port
		if p.TCPSocket.Host != "" {
			host = p.TCPSocket.Host
		}
	case p.HTTPGet != nil:
		if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			return nil, nil
		}
		port = p.HTTPGet.Port
		if p.HTTPGet.Host != "" {
			host = p.HTTPGet.Host
		}
		r.path = p.HTTPGet.Path
		if r.path == "" || r.path[0] != '/' {
			r.path = "/" + r.path
		}
		r.http = &http.Transport{DisableKeepAlives: true}
	default:
		return nil, nil
	}
	n, err := containerPort(c, port)
	if err != nil {
		return &readiness{probe: p}, err // it never succeeds, as a kubelet's would not
	}
	r.addr = net.JoinHostPort(host, strconv.Itoa(n))
	return r, nil
}

// containerPort resolves a probe's port, a number or the name of one of c's ports.
func containerPort(c *corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("readiness probe: container %s has no port named %q", c.Name, port.StrVal)
}

func seconds(v int32, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// run probes after the initial delay and then every period, sending each result on out, until
// ctx ends.
func (r *readiness) run(ctx context.Context, out chan<- bool) {
	t := time.NewTimer(time.Duration(r.probe.InitialDelaySeconds) * time.Second)
	defer t.Stop()
	period := seconds(r.probe.PeriodSeconds, 10)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok := r.once(ctx)
		select {
		case out <- ok:
		case <-ctx.Done():
			return
		}
		t.Reset(period)
	}
}

// once runs the probe one time.
func (r *readiness) once(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, seconds(r.probe.TimeoutSeconds, 1))
	defer cancel()
	if r.http == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", r.addr)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.addr+r.path, nil)
	if err != nil {
		return false
	}
	for _, h := range r.probe.HTTPGet.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := r.http.RoundTrip(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// readyTracker turns probe results into readiness with the probe's thresholds.
type readyTracker struct {
	success, failure int32 // thresholds
	okRun, failRun   int32
}

func newReadyTracker(p *corev1.Probe) readyTracker {
	return readyTracker{success: max(p.SuccessThreshold, 1), failure: max(p.FailureThreshold, 1)}
}

// add records a result and returns the readiness it gives, from ready before it.
func (t *readyTracker) add(ok, ready bool) bool {
	if ok {
		t.okRun, t.failRun = t.okRun+1, 0
		return ready || t.okRun >= t.success
	}
	t.okRun, t.failRun = 0, t.failRun+1
	return ready && t.failRun < t.failure
}
