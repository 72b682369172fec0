package train

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"golang.org/x/sync/errgroup"
)

// denseTensor is one MLP tensor stored on the parameter servers as a dense tensor.
type denseTensor struct {
	name     string // name on the servers
	off, len int    // place in model.Params
}

// densePrefix starts the server-side name of every MLP tensor.
const densePrefix = "mlp."

func denseTensors(m *model.Model) []denseTensor {
	var out []denseTensor
	for _, t := range m.Tensors() {
		out = append(out, denseTensor{name: densePrefix + t.Name, off: t.Offset, len: t.Len()})
	}
	return out
}

// pullDense fills params with the tensors held by the servers, in parallel.
func pullDense(ctx context.Context, g *errgroup.Group, cli *ps.Client, tensors []denseTensor, params []float32) {
	for _, t := range tensors {
		g.Go(func() error {
			if err := cli.PullDense(ctx, t.name, params[t.off:t.off+t.len]); err != nil {
				return fmt.Errorf("pull %s: %w", t.name, err)
			}
			return nil
		})
	}
}

// pushDense pushes the dense gradient, one tensor per call, in parallel.
func pushDense(ctx context.Context, g *errgroup.Group, cli *ps.Client, tensors []denseTensor, grads []float32, step uint32) {
	for _, t := range tensors {
		g.Go(func() error {
			if err := cli.PushDense(ctx, t.name, grads[t.off:t.off+t.len], step); err != nil {
				return fmt.Errorf("push %s: %w", t.name, err)
			}
			return nil
		})
	}
}

// initDense creates every tensor on its server with the model's initial values, unless it
// exists (the first caller wins).
func initDense(ctx context.Context, cli *ps.Client, tensors []denseTensor, params []float32, opt embedding.Optimizer) error {
	for _, t := range tensors {
		if err := cli.InitDense(ctx, t.name, params[t.off:t.off+t.len], opt); err != nil {
			return fmt.Errorf("init %s: %w", t.name, err)
		}
	}
	return nil
}

// The dense tensors of a server are saved as a checkpoint blob: the checkpoint package places
// table rows by the slot of their id, while a dense tensor lives on the owner of the slot of its
// name, so its rows travel whole, with what is needed to recreate the tensor anywhere.
//
//	"DLRMDNS1" count:u32
//	per tensor: nameLen:u16 name length:u32 optimizer:(kind:u32, 8×f32) schemaLen:u32 schema rawLen:u32 raw
const denseMagic = "DLRMDNS1"

// denseBlobName is the name of a server's dense blob in a checkpoint.
const denseBlobName = "dense"

var errDenseBlob = errors.New("train: corrupt dense blob")

// denseEntry is one saved tensor.
type denseEntry struct {
	name   string
	length int
	opt    embedding.Optimizer
	schema []byte
	raw    []byte
}

// encodeDense copies the dense tensors hosted by srv (names starting with densePrefix) into a
// blob. Call it at the checkpoint barrier, when no push is being applied.
func encodeDense(srv *ps.Server) ([]byte, error) {
	var entries []denseEntry
	for _, name := range srv.TableNames() {
		n, ok := srv.DenseLength(name)
		if !ok {
			continue
		}
		t, ok := srv.Table(name)
		if !ok {
			continue
		}
		raw := make([]byte, t.RawSize(false))
		k, err := t.CopyRaw(raw, false, false)
		if err != nil {
			return nil, fmt.Errorf("copy %s: %w", name, err)
		}
		entries = append(entries, denseEntry{name: name, length: n, opt: t.Config().Optimizer, schema: t.Schema(), raw: raw[:k]})
	}
	return appendDense(nil, entries), nil
}

// appendDense appends the encoding of entries to b.
func appendDense(b []byte, entries []denseEntry) []byte {
	b = append(b, denseMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entries)))
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(e.name)))
		b = append(b, e.name...)
		b = binary.LittleEndian.AppendUint32(b, uint32(e.length))
		b = binary.LittleEndian.AppendUint32(b, uint32(e.opt.Kind))
		for _, v := range []float32{e.opt.LearningRate, e.opt.Eps, e.opt.InitialAccumulator, e.opt.Beta1, e.opt.Beta2, e.opt.Beta, e.opt.L1, e.opt.L2} {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.schema)))
		b = append(b, e.schema...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.raw)))
		b = append(b, e.raw...)
	}
	return b
}

// decodeDense reads a blob written by encodeDense, checking every length.
func decodeDense(b []byte) ([]denseEntry, error) {
	if len(b) < len(denseMagic)+4 || string(b[:len(denseMagic)]) != denseMagic {
		return nil, fmt.Errorf("%w: bad header", errDenseBlob)
	}
	b = b[len(denseMagic):]
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	take := func(k int) ([]byte, bool) {
		if len(b) < k {
			return nil, false
		}
		out := b[:k]
		b = b[k:]
		return out, true
	}
	var out []denseEntry
	for i := uint32(0); i < n; i++ {
		h, ok := take(2)
		if !ok {
			return nil, fmt.Errorf("%w: truncated", errDenseBlob)
		}
		name, ok := take(int(binary.LittleEndian.Uint16(h)))
		if !ok {
			return nil, fmt.Errorf("%w: truncated name", errDenseBlob)
		}
		fixed, ok := take(4 + 4 + 32 + 4)
		if !ok {
			return nil, fmt.Errorf("%w: truncated tensor %q", errDenseBlob, name)
		}
		f := func(k int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(fixed[8+4*k:])) }
		e := denseEntry{
			name: string(name), length: int(binary.LittleEndian.Uint32(fixed)),
			opt: embedding.Optimizer{Kind: embedding.OptimizerKind(binary.LittleEndian.Uint32(fixed[4:])),
				LearningRate: f(0), Eps: f(1), InitialAccumulator: f(2), Beta1: f(3), Beta2: f(4), Beta: f(5), L1: f(6), L2: f(7)},
		}
		schema, ok := take(int(binary.LittleEndian.Uint32(fixed[40:])))
		if !ok {
			return nil, fmt.Errorf("%w: truncated schema of %q", errDenseBlob, e.name)
		}
		rl, ok := take(4)
		if !ok {
			return nil, fmt.Errorf("%w: truncated tensor %q", errDenseBlob, e.name)
		}
		raw, ok := take(int(binary.LittleEndian.Uint32(rl)))
		if !ok {
			return nil, fmt.Errorf("%w: truncated rows of %q", errDenseBlob, e.name)
		}
		if e.length < 1 {
			return nil, fmt.Errorf("%w: tensor %q has length %d", errDenseBlob, e.name, e.length)
		}
		if e.opt.Kind < embedding.SGD || e.opt.Kind > embedding.FTRL {
			return nil, fmt.Errorf("%w: tensor %q has optimizer kind %d", errDenseBlob, e.name, e.opt.Kind)
		}
		for k := range 8 {
			if v := f(k); math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: tensor %q has a non-finite optimizer setting", errDenseBlob, e.name)
			}
		}
		e.schema, e.raw = bytes.Clone(schema), bytes.Clone(raw)
		out = append(out, e)
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errDenseBlob, len(b))
	}
	return out, nil
}

// restoreDense recreates the saved tensors where they live now and loads their rows bit-exactly
// (weights and optimizer state). owns says which tensors this process loads (those whose name's
// slot a local server owns); cli creates a tensor that does not exist yet (InitDense of zeros,
// replaced at once; a no-op for a tensor that exists); lookup finds the local table.
func restoreDense(ctx context.Context, cli *ps.Client, entries []denseEntry, owns func(name string) bool, lookup func(name string) (*embedding.Table, bool)) (int, error) {
	loaded := 0
	for _, e := range entries {
		if !owns(e.name) {
			continue
		}
		if err := cli.InitDense(ctx, e.name, make([]float32, e.length), e.opt); err != nil {
			return loaded, fmt.Errorf("recreate %s: %w", e.name, err)
		}
		t, ok := lookup(e.name)
		if !ok {
			return loaded, fmt.Errorf("dense %s: not hosted by the server that owns it", e.name)
		}
		if !bytes.Equal(t.Schema(), e.schema) {
			return loaded, fmt.Errorf("dense %s: the checkpoint's row layout differs from this run's (another optimizer or size?)", e.name)
		}
		if _, err := t.LoadRaw(e.raw, nil); err != nil {
			return loaded, fmt.Errorf("load %s: %w", e.name, err)
		}
		loaded++
	}
	return loaded, nil
}
