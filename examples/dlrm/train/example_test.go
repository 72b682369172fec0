package train_test

import (
	"context"
	"fmt"
	"os"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
)

// A small synthetic job on an embedded cluster of two parameter servers and two workers:
// two epochs of 4096 records, a checkpoint every 10 steps and one at the end.
func Example() {
	dir, _ := os.MkdirTemp("", "dlrm-example")
	defer os.RemoveAll(dir)
	s, err := train.Run(context.Background(), train.Config{
		Synth:        model.SynthConfig{DenseFeatures: 4, Vocab: []int{10, 100, 1000}},
		TrainRecords: 4096, TestRecords: 1000, Epochs: 2, ShardSize: 512,
		EmbeddingDim: 4, BottomHidden: []int{8}, TopHidden: []int{8}, BatchSize: 64,
		CheckpointDir: dir, ShmDir: dir + "/shm", CheckpointEvery: 10, EvalEvery: -1,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("samples trained:", s.Samples)
	fmt.Println("exactly once per epoch:", s.ExactlyOnce)
	fmt.Println("last step committed:", s.Checkpoints.LastCommitted == uint64(s.Steps))
	fmt.Println("held-out records scored:", s.Eval.Samples)
	// Output:
	// samples trained: 8192
	// exactly once per epoch: true
	// last step committed: true
	// held-out records scored: 1000
}
