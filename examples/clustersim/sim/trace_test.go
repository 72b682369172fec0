package sim

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseErrorsNameFileAndLine(t *testing.T) {
	cases := []struct {
		name  string
		parse func(string, string) error
		input string
		line  int
	}{
		{"philly bad duration", wrap(ParsePhilly), "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,a\n2017-10-09 07:01:56,abc,1,66.0,a\n", 3},
		{"philly bad time", wrap(ParsePhilly), "timestamp,duration,num_gpus,gpu_time,cluster\n2017/10/09,66.0,1,66.0,a\n", 2},
		{"philly zero gpus", wrap(ParsePhilly), "timestamp,duration,num_gpus,gpu_time,cluster\n\n2017-10-09 07:01:55,66.0,0,66.0,a\n", 3},
		{"philly missing column", wrap(ParsePhilly), "timestamp,duration,gpu_time,cluster\n", 1},
		{"philly short row", wrap(ParsePhilly), "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0\n", 2},
		{"pollux workload", wrap(ParsePolluxWorkload), "name,time,application,num_replicas,batch_size\nncf-0,10,ncf,1,512\nncf-1,11,ncf,-1,512\n", 3},
		{"scalability", wrap(ParseScalability), "num_nodes,num_replicas,local_bsz,step_time,sync_time\n1,1,32,0,0\n", 2},
		{"placements", wrap(ParsePlacements), "placement,local_bsz,step_time,sync_time\n1,32,0.1,0\n4x,32,0.1,0\n", 3},
		{"gavel fields", wrap(ParseGavelTrace), "A3C\tcmd\t-n\t1\t100\t0.0\t1\nA3C\tcmd\t-n\t1\t100\n", 2},
		{"gavel steps", wrap(ParseGavelTrace), "A3C\tcmd\t-n\t1\tx\t0.0\t1\n", 1},
		{"gavel json syntax", wrap(ParseGavelThroughputs), "{\n \"v100\": {\n  \"('A3C', 1)\": {\"null\": 1.0},\n }\n}\n", 4},
		{"gavel json value", wrap(ParseGavelThroughputs), "{\n \"v100\": {\n  \"('A3C', 1)\": {\"null\": -2}\n }\n}\n", 3},
		{"alibaba role", wrap(ParseAlibabaDLRM), alibabaHeader + "i0,CN,app_0,64,64,0,0,1,1,320,320,1,1,-1,,,\ni1,XX,app_0,64,64,0,0,1,1,320,320,1,1,-1,,,\n", 3},
		{"alibaba cpu", wrap(ParseAlibabaDLRM), alibabaHeader + "i0,CN,app_0,zero,64,0,0,1,1,320,320,1,1,-1,,,\n", 2},
		{"machine spec", wrap(ParseMachineSpec), "m0,CPU,96,512,0\nm1,CPU,96,-1,0\n", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.parse("f.csv", c.input)
			require.Error(t, err)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "%v", err)
			assert.ErrorIs(t, err, ErrBadTrace)
			assert.Equal(t, "f.csv", pe.File)
			assert.Equal(t, c.line, pe.Line, "%v", err)
			assert.True(t, strings.HasPrefix(err.Error(), "f.csv:"), err.Error())
		})
	}
}

const alibabaHeader = "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,deletion_time\n"

func wrap[T any](p func(string, io.Reader) (T, error)) func(string, string) error {
	return func(name, in string) error {
		_, err := p(name, strings.NewReader(in))
		return err
	}
}

func TestParseGood(t *testing.T) {
	ph, err := ParsePhilly("p", strings.NewReader("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,4,264.0,11cb48\n\n"))
	require.NoError(t, err)
	require.Len(t, ph, 1)
	assert.Equal(t, 66.0, ph[0].Duration)
	assert.Equal(t, 4, ph[0].GPUs)
	assert.Equal(t, 2, ph[0].Line)

	g, err := ParseGavelThroughputs("g", strings.NewReader(`{"v100": {"('LM (batch size 5)', 2)": {"null": 3.5, "('A3C', 1)": [1, 2]}, "('A3C', 1)": {"null": 0.0}}}`))
	require.NoError(t, err)
	v, ok := g.Of("v100", "LM (batch size 5)", 2)
	assert.True(t, ok)
	assert.Equal(t, 3.5, v)
	_, ok = g.Of("v100", "A3C", 1) // 0: not measured
	assert.False(t, ok)

	pl, err := ParsePlacements("pl", strings.NewReader("placement,local_bsz,step_time,sync_time\n44,64,0.2,0.1\n"))
	require.NoError(t, err)
	assert.Equal(t, ScalePoint{Nodes: 2, Replicas: 8, LocalBatch: 64, StepTime: 0.2, SyncTime: 0.1}, pl[0])

	in, err := ParseAlibabaDLRM("a", strings.NewReader(alibabaHeader+"i0,HN,app_3,8,8,1,1,25,25,40.0,40.0,1,1,8,NaN,,12.5\n"))
	require.NoError(t, err)
	assert.Equal(t, "HN", in[0].Role)
	assert.Equal(t, 40.0, in[0].MemGiB)
	assert.Equal(t, 12.5, in[0].Deleted)
}
