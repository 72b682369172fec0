package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/statuspage"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The status sub-command reads a running coordinator's status over its authenticated port.
func TestStatusSubcommand(t *testing.T) {
	ctx := context.Background()
	secret := []byte("the secret of the status test...")
	job, err := local.Start(ctx, local.Config{Job: "status", Servers: 2, Secret: secret,
		Tables:      []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4, Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.1}}}},
		Coordinator: elastic.Config{Dispatcher: shard.Config{Dataset: shard.IndexedDataset(1000)}}})
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	srv, err := shardnet.NewServer(shardnet.ServerConfig{Service: job.Coordinator().Service(), Secret: secret})
	require.NoError(t, err)
	require.NoError(t, remote.ServeControl(srv, job.Coordinator()))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "secret"), filepath.Join(dir, "other")
	require.NoError(t, os.WriteFile(good, append(secret, '\n'), 0o600))
	require.NoError(t, os.WriteFile(bad, []byte("not the secret of this job......"), 0o600))
	addr := l.Addr().String()

	var out, errs bytes.Buffer
	require.Equal(t, 0, run([]string{"status", "-dispatcher", addr, "-secret-file", good}, &out, &errs), errs.String())
	for _, want := range []string{"job status: training, coordinator incarnation 1", "data: epoch 1 of 1, 0 of 1000 records trained", "ps-0", "ps-1", "serving"} {
		assert.Contains(t, out.String(), want)
	}

	out.Reset()
	require.Equal(t, 0, run([]string{"status", "-json", "-dispatcher", addr, "-secret-file", good}, &out, &errs), errs.String())
	var st elastic.Status
	require.NoError(t, json.Unmarshal(out.Bytes(), &st))
	assert.Equal(t, "status", st.Job)
	assert.Len(t, st.Servers, 2)

	errs.Reset()
	assert.Equal(t, 1, run(strings.Fields("status -timeout 2s -dispatcher "+addr+" -secret-file "+bad), &out, &errs), "a wrong secret is refused")
	assert.Contains(t, errs.String(), "dlrm status:")
	assert.Equal(t, 2, run([]string{"status", "-dispatcher", addr}, &out, &errs))

	// The same status read from the coordinator's status page, served as on loopback and as
	// off it (where the page asks for the secret's token).
	page, err := statuspage.New(statuspage.Config{Source: job.Coordinator(), Secret: secret})
	require.NoError(t, err)
	page.Sample(ctx)
	for _, auth := range []bool{false, true} {
		hs := httptest.NewServer(page.Handler(auth))
		url := hs.URL + "/"
		out.Reset()
		require.Equal(t, 0, run([]string{"status", "-page", url, "-secret-file", good, "-json"}, &out, &errs), errs.String())
		st = elastic.Status{}
		require.NoError(t, json.Unmarshal(out.Bytes(), &st))
		assert.Equal(t, "status", st.Job, url)
		assert.Len(t, st.Servers, 2, url)
		errs.Reset()
		code := run([]string{"status", "-page", url, "-secret-file", bad}, &out, &errs)
		if !auth {
			assert.Equal(t, 0, code, "a page on loopback asks for nothing")
		} else {
			assert.Equal(t, 1, code, "off loopback, a wrong secret is refused")
			assert.Contains(t, errs.String(), "dlrm status:")
		}
		hs.Close()
	}
	assert.Equal(t, 2, run([]string{"status", "-page", "http://127.0.0.1:1/", "-dispatcher", addr}, &out, &errs), "one of -page and -dispatcher")
}
