// Package model is the numeric core of the DLRM trainer in examples/dlrm:
// the network, its forward and backward passes over a mini-batch, local
// optimizers, evaluation metrics and a synthetic Criteo-like data set with a
// known Bayes-optimal ceiling. It imports nothing of elasticps: parameters
// enter and leave as plain slices, so the trainer pulls them from and pushes
// them to the parameter servers itself.
//
// # Network
//
// DLRM (Naumov et al., 2019) for one sample with D dense features, F
// categorical fields and embedding dimension d:
//
//	z0   = bottomMLP(dense)                  ReLU after every layer, width d
//	e_f  = pool(rows of field f)             sum or mean, per field
//	t    = [z0, e_1, …, e_F]                 F+1 vectors of width d
//	top  = [z0, <t_i, t_j> for 0 ≤ i < j ≤ F] width d + F(F+1)/2
//	     or [t, <t_i, t_j> …]                width (F+1)d + F(F+1)/2 with
//	                                         Config.ConcatEmbeddings
//	z    = topMLP(top)                       ReLU on hidden layers, one logit
//	     + Σ_f pool(scalars of field f)      with Config.FirstOrder
//	loss = BCE(sigmoid(z), label)            computed from the logit, stably
//
// With Config.FirstOrder every embedding row has a scalar beside it
// (Batch.Biases, gradients in Gradients.Biases), pooled like the row: the
// first-order terms of a factorisation machine, a learned offset per id.
//
// The pairwise products are listed in row-major upper-triangle order:
// (0,1), (0,2), …, (0,F), (1,2), …, (F-1,F). The batch loss is the mean
// over samples, and every gradient is a gradient of that mean.
//
// # Dense parameter layout
//
// All MLP weights and biases live in one flat []float32 (Model.Params), so
// they can be stored on the parameter servers as named dense tensors or as
// one vector. Model.Tensors lists them with name, offset and shape, in this
// order:
//
//	bottom.0.weight [D, h1]   bottom.0.bias [h1]
//	bottom.1.weight [h1, h2]  bottom.1.bias [h2]
//	…                          (last bottom layer has width d)
//	top.0.weight [d+F(F+1)/2, g1]  top.0.bias [g1]   ((F+1)d+F(F+1)/2 inputs
//	                                                  with ConcatEmbeddings)
//	…
//	top.L.weight [gL, 1]      top.L.bias [1]
//
// A weight of shape [in, out] is row-major with the input index outer: a
// layer computes y[o] = b[o] + Σ_i x[i]·W[i*out+o]. (This is the transpose
// of PyTorch's nn.Linear storage.) With the default Config the vector holds
// 58 929 values. Gradients.Dense has exactly the same layout.
//
// # Embeddings in, embedding gradients out
//
// The model never sees ids. The trainer resolves the ids of a batch to
// embedding vectors (one pull from the parameter servers), puts them in
// Batch.Rows and says which rows make up each (sample, field) bag with
// Batch.Bags and Batch.Index (see Batch). ComputeGradients returns, in
// Gradients.Rows, one gradient row per row of Batch.Rows, already summed over
// every occurrence of that row in the batch and scaled by 1/bag-size for
// mean-pooled fields: with de-duplicated rows that is exactly the per-id
// gradient to push. BatchBuilder does the de-duplication:
//
//	bb.Reset()
//	for _, s := range samples { bb.Add(&s) }
//	pull(bb.Keys(), bb.Rows())            // fill row r with key r's vector
//	m.ComputeGradients(bb.Batch(), &g)
//	push(bb.Keys(), g.Rows)               // row r is key r's gradient
//	push(denseNames, g.Dense)             // or opt.Update(m.Params(), g.Dense)
//
// Computing gradients and applying them are separate steps: in the
// parameter-server trainer the servers apply the optimizer, and the SGD,
// Adagrad and Adam types here serve local training and tests.
//
// # Ownership and concurrency
//
// A Model owns its parameter vector (Params returns it, not a copy) and its
// scratch buffers. Batch slices belong to the caller; the model only reads
// them during a call and keeps none. Gradients slices belong to the caller
// and are reused by the next call that receives the same Gradients. A Model,
// a BatchBuilder and the optimizers are not safe for concurrent use: run one
// per goroutine (the dense parameters are small, so copies are cheap). A
// Synth is immutable and safe for concurrent use. The metric functions are
// pure.
//
// Steady-state training steps do not allocate: the model's buffers grow
// only when a batch is larger than every earlier one, and Gradients and
// BatchBuilder reuse theirs.
//
// # Speed
//
// The matrix products use one hand-written pure-Go kernel (see matmul.go);
// they take about three quarters of a training step. On the largest product
// of the default model at batch 256 the kernel runs roughly ten times faster
// than a textbook triple loop (BenchmarkGemm). gonum's Sgemm (assembly SIMD
// level-1 kernels; not a dependency of this module) measured 1.1–1.7×
// faster than this kernel single-threaded on the three products of that
// layer: about 1.25× on a whole step, not enough to add a dependency. A
// Model uses one goroutine; to use more cores run one Model per core.
//
// # Data and metrics
//
// Synth generates a deterministic, unbounded, index-addressable stream of
// Criteo-like records whose labels are drawn from a hidden model; Ceiling
// reports the AUC and log loss of the hidden model's true probabilities on
// any record range, the best any learner can reach there. AUC is exact
// (sort-based, ties at average rank); LogLoss and LogLossLogits are mean
// binary cross-entropies.
package model
