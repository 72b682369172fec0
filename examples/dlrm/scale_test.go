package main

import (
	"bytes"
	"testing"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScaleCommandArguments(t *testing.T) {
	nodes, err := parseNodes("ps-2=127.0.0.1:7003, ps-3=h:1")
	require.NoError(t, err)
	assert.Equal(t, []ps.Node{{ID: "ps-2", Addr: "127.0.0.1:7003"}, {ID: "ps-3", Addr: "h:1"}}, nodes)
	for _, bad := range []string{"ps-2", "=h:1", "ps-2="} {
		_, err := parseNodes(bad)
		assert.Error(t, err, bad)
	}
	var out, errOut bytes.Buffer
	assert.Equal(t, 2, run([]string{"scale", "-dispatcher", "h:1"}, &out, &errOut), "no secret, nothing to do")
	assert.Equal(t, 2, run([]string{"scale", "-dispatcher", "h:1", "-secret-file", "f", "-add", "ps-2=h:2", "-remove", "ps-0"}, &out, &errOut), "both at once")
	assert.Contains(t, errOut.String(), "one of -add, -remove, -ps with -workers, or -rebalance")
	errOut.Reset()
	assert.Equal(t, 2, run([]string{"scale", "-dispatcher", "h:1", "-ps", "3"}, &out, &errOut), "-ps alone")
	assert.Contains(t, errOut.String(), "-ps and -workers go together")
	errOut.Reset()
	assert.Equal(t, 2, run([]string{"scale", "-dispatcher", "h:1", "-add", "ps-2"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "-add: \"ps-2\" is not ID=HOST:PORT")
}

func TestProgressLineShowsAMove(t *testing.T) {
	line := status(train.Progress{Epochs: 1, Moving: &elastic.RepartitionStatus{Running: true, From: 2, To: 3, SlotsDone: 10, SlotsTotal: 1370}})
	assert.Contains(t, line, "servers 2 -> 3: 10/1370 slots moved")
	assert.NotContains(t, status(train.Progress{Epochs: 1}), "servers")
}
