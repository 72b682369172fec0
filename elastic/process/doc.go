// Package process runs the processes of an elastic job on this host with os/exec. A Scaler runs
// the roles of a job as processes of one program: the coordinator (if asked), the parameter
// servers and the workers of a Plan, each started with the arguments Config.Args gives for its
// role and node id, since the library does not know the program's flags. Each node id has one
// goroutine that starts its process, waits for it and starts it again after an abnormal exit (a
// signal or a nonzero status) as the same node id, up to Config.MaxRestarts, whatever its role;
// a process that exits with status 0 is done. A process that Scale, StopServers or Close stops
// gets SIGTERM, then SIGKILL after Config.StopGrace, and is never restarted.
//
// A restarted process is a new incarnation of its node: a parameter server comes back empty
// and the coordinator restores it, a worker joins again, and a restarted coordinator must take
// the running job over (Coordinator.Resume): Launch.Restart tells Args which start it is.
//
// # Scaling
//
// Scaler obeys the contract written on elastic.Scaler (elastictest.TestScaler checks it). Its
// first Scale starts the plan's servers (and the coordinator, with Config.Coordinator) and
// workers; later ones set the number of workers and keep the servers, refusing a plan with
// another server count. That count changes through StartServers and StopServers, which the
// coordinator calls in a live repartition; StartServers needs Config.Server, to hand the
// coordinator the servers it starts, and fails with errors.ErrUnsupported without it.
//
// # Concurrency
//
// A Scaler is safe for concurrent use. Config.Args, Env, Output and OnEvent are called from the
// goroutine that watches the node id they are about: calls about different node ids may come
// concurrently, and one node id's come in order. Close is idempotent, stops every process (the
// servers last) and joins every goroutine.
package process
