// Package elastictest is the test kit of package elastic: what a program built on elastic needs
// to test itself in memory, and what elastic's own backends are checked with.
//
//   - Job runs a whole job in one process on an in-memory network: parameter servers on hosts
//     of their own, a coordinator whose dispatcher and control calls are served on the network,
//     and workers' Sessions on hosts of their own, with the network's faults (Partition, SetDrop,
//     Kill) between them. Given a testing.TB (Config.T), it is closed when the test ends.
//   - FaultServer wraps an elastic.ParameterServer and fails, holds or counts its calls by rule
//     (Inject): a lost owner table, a fence that hangs, a persist held until the test lets it
//     go. What it does depends only on the calls it gets, in their order.
//   - Recorder is an elastic.ServerScaler that runs nothing: it records the plans it is given,
//     keeps the books of the processes it would run, fails on demand, and starts servers through
//     a ServerPool (a Job).
//   - Clock is a fake wall clock for elastic.Config.Now.
//   - TestScaler checks an elastic.Scaler (and ServerScaler) against the contract written on
//     them; each backend's tests run it (local, process, and any scaler written outside this
//     module) with a ScalerHarness that starts the scaler and watches its processes.
//
// # Concurrency
//
// Job, FaultServer, Fault, Recorder and Clock are safe for concurrent use. A FaultServer's rule
// functions (Rule.Match) are called from the goroutines that call the server, under the
// server's lock: they must not block or call the server. TestScaler runs on the test's
// goroutine; a harness's Await and Crash are called from it too.
package elastictest
