package train

import (
	"context"
	"fmt"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"golang.org/x/sync/errgroup"
)

// denseTensor is one MLP tensor stored on the parameter servers as a dense tensor.
type denseTensor struct {
	name     string // name on the servers
	off, len int    // place in model.Model.Params
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
func pullDense(ctx context.Context, g *errgroup.Group, pull func(ctx context.Context, name string, dst []float32) error, tensors []denseTensor, params []float32) {
	for _, t := range tensors {
		g.Go(func() error {
			if err := pull(ctx, t.name, params[t.off:t.off+t.len]); err != nil {
				return fmt.Errorf("pull %s: %w", t.name, err)
			}
			return nil
		})
	}
}

// pushDense pushes the dense gradient, one tensor per call, in parallel.
func pushDense(ctx context.Context, g *errgroup.Group, push func(ctx context.Context, name string, grads []float32) error, tensors []denseTensor, grads []float32) {
	for _, t := range tensors {
		g.Go(func() error {
			if err := push(ctx, t.name, grads[t.off:t.off+t.len]); err != nil {
				return fmt.Errorf("push %s: %w", t.name, err)
			}
			return nil
		})
	}
}

// denseSpecs declares every MLP tensor on the servers (each lives on the owner of its name's
// slot, and is checkpointed with the embedding tables).
func denseSpecs(tensors []denseTensor, opt embedding.Optimizer) []ps.TableSpec {
	specs := make([]ps.TableSpec, len(tensors))
	for i, t := range tensors {
		specs[i] = ps.TableSpec{Name: t.name, Dense: t.len, Config: embedding.Config{Optimizer: opt}}
	}
	return specs
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
