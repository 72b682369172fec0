// Package statuspage is a job coordinator's live status page: a small HTML page, rendered by
// the server with html/template from files embedded in the binary (no framework, nothing
// loaded from another site: it works on a host with no network), and the same data as JSON.
//
// # What it shows
//
//   - the job: phase, plan, data epoch and progress, steps and the newest commit, the
//     coordinator's incarnation, whether exactly-once holds;
//   - the members: every parameter server with its address, host and process, health, the
//     slots it owns, its CPU and memory; every worker with its health, batches and rate;
//   - the owner table as a grid of slots coloured by owner, with a legend, the slots a move
//     is still to hand over hatched;
//   - throughput (records trained per second, which the page measures from the job's
//     status), and the series the program observes (loss, held-out AUC, ...) over time;
//   - the checkpoint timeline: each checkpoint's pause at the barrier and the time to its
//     commit, the newest in a table;
//   - the recoveries from server failures, and the events the samples saw: servers and
//     workers that came, failed or left, plans, changes of the server count.
//
// The page fetches its changing part every sample period and swaps it in, so it refreshes
// without a reload; a browser without script reloads it (meta refresh).
//
// # Use
//
// A Page samples a Source, *elastic.Coordinator, every Config.Every. The program gives the page
// the coordinator's progress events (so it makes the page first: ObserveProgress, or
// ObserveCheckpoint and ObserveRecovery chained into OnCheckpoint and OnRecovery) and reports
// its own figures:
//
//	page, err := statuspage.New(statuspage.Config{Secret: secret})
//	cfg.OnProgress = page.ObserveProgress // or called from the program's own
//	coord, err := elastic.NewCoordinator(ctx, cfg)
//	page.SetSource(coord)
//	ln, err := net.Listen("tcp", ":8080")
//	go page.Serve(ctx, ln)
//	...
//	page.Observe("loss", loss) // from the training loop
//	page.Observe("auc", auc)   // after each held-out evaluation
//
// Serve serves the page and samples until ctx ends. A program with an HTTP server of its own
// mounts Handler and calls Run to sample. Fetch reads the JSON of a page from another process
// (a status command).
//
// # Access
//
// The page shows the job's topology, so it is protected by the cluster secret: a client sends
// the token derived from it (Token) as "Authorization: Bearer <token>"; a person types the
// token, or the secret itself when it is text, into the login form, which keeps the token in
// an HttpOnly, SameSite=Strict cookie. The token is compared in constant time. A page served
// on a loopback address (Serve decides from the listener's address) is open to every process
// of its host; Handler(requireAuth) lets a program that mounts the page decide. The page sends
// a content security policy that allows nothing but its own files.
//
// # Memory
//
// Everything the page keeps is bounded: each series keeps its newest Config.History points,
// at most Config.MaxSeries observed series are kept, and checkpoints, recoveries and events
// the newest Config.Events each. Only the newest status is kept.
//
// # Concurrency
//
// A Page's methods are safe for concurrent use: Observe from the training loop,
// ObserveCheckpoint and ObserveRecovery from the coordinator's callbacks (the page calls
// nothing back from them), the handler from the HTTP server's goroutines. One Run or Serve
// samples a page at a time. A Page owns no goroutine outside Run and Serve, which return
// once every goroutine they started has ended; so it needs no Close. A Snapshot is the
// caller's: it shares nothing the page changes.
package statuspage
