// Package local runs an elastic job in one process: Start starts the job's parameter servers,
// serving on loopback TCP with the cluster secret, and its coordinator; Job.NewSession gives an
// in-process worker its session; Scaler runs the workers of a plan as goroutines. It is what a
// single-machine job, a benchmark or a test of the whole protocol uses, and it plays the
// failures of the processes it stands for: KillServer and RestartServer (a parameter server's
// process dies and comes back), RestartCoordinator (the coordinator dies and a new one takes
// the running job over). Job.Digest and Job.DigestCommit fingerprint the job's model and a
// commit's, for a program that checks a repartition or a restore bit for bit.
//
// # Scaling
//
// Scaler obeys the contract written on elastic.Scaler (elastictest.TestScaler checks it):
// Scale sets the number of workers, starting worker-i goroutines, each training through its own
// Session, and stopping the highest-numbered (each finishes the batch in hand and leaves);
// a worker whose function keeps failing is started again up to ScalerConfig.MaxRestarts. The
// servers are the Job's: Scale keeps their number, and StartServers and StopServers (the
// coordinator's live repartition calls them, through Job.StartServers and Job.StopServers)
// change it. A server that dies is restarted by Job.RestartServer, not by the scaler.
//
// # Concurrency
//
// Job and Scaler are safe for concurrent use, with two exceptions: Job.Servers is replaced
// element by element by RestartServer and grown and cut by StartServers and StopServers, so read
// it while none of those runs; and RestartServer restarts one server from one goroutine at a
// time. A Session is used by one goroutine at a time. ScalerConfig.Reader and Worker are called
// from the workers' goroutines, for different workers concurrently. Close, of a Job or a
// Scaler, is idempotent and joins every goroutine; closing a Scaler stops its workers but not
// its Job's servers.
package local
