// Package metrics exposes a job's processes to Prometheus (client_golang): a parameter
// server's traffic and holdings, a worker's steps, the coordinator's view of the job, and each
// process's CPU and memory.
//
// The library registers nothing by itself and keeps no global registry: a program makes the
// collectors it wants and registers them on a prometheus.Registerer of its own, which it serves
// on an address its flags give:
//
//	reg := prometheus.NewRegistry()
//	metrics.RegisterProcess(reg, metrics.Config{Job: "ctr", Role: "ps", Node: "ps-0"})
//	srv, _ := metrics.NewServer(psServer, metrics.Config{Job: "ctr"}) // reads psServer.Stats at each scrape
//	reg.MustRegister(srv)
//	go metrics.Serve(ctx, ln, reg, logger) // GET /metrics
//
// The coordinator's collector reads its Status at each scrape and takes the checkpoint and
// recovery events (Coordinator.Hook chains them into elastic.Config before NewCoordinator),
// and the autoscaler's decisions (ObserveDecision with what autoscale.Runner.Tick returns):
//
//	cm, _ := metrics.NewCoordinator(metrics.Config{Job: "ctr"})
//	cm.Hook(&cfg)                            // cfg is the elastic.Config
//	c, _ := elastic.NewCoordinator(ctx, cfg)
//	cm.SetSource(c)
//	reg.MustRegister(cm)
//
// A worker times its steps and hands them to its Worker (ObserveStep).
//
// # The series
//
// Every series is named elasticps_<role>_..., in base units (seconds, bytes), counters ending
// in _total, and carries the constant labels of its Config: training_job, role and node (not
// job and instance, the labels Prometheus gives every target). Server, Worker and Coordinator
// list theirs. Counters that the core keeps (requests, rows, checkpoints, failures) are read
// at each scrape and built as constant metrics, so they are never counted twice; the few that
// only events give (checkpoint pauses and persist times, recoveries, autoscaler decisions,
// worker steps) are kept here, from the collector's start. RegisterProcess adds the standard
// process_... (from /proc: CPU seconds, resident memory, ...) and go_... series.
//
// A dashboard built on these series is in examples/grafana/elasticps.json; the package's tests
// hold its expressions to the names a running job exposes.
//
// # Concurrency
//
// Server, Worker and Coordinator are safe for concurrent use: scrapes run concurrently with
// each other and with the Observe methods. A collector's sources (StatsSource, StatusSource)
// are called on the scraping goroutine and must not block for long.
package metrics
