// Package shardtest is the test kit of package shard: a fake clock and sleeper, a Service
// wrapper that fails on demand (a dispatcher that is down or restarting, requests or answers
// lost, at given calls or at random), a Ledger that checks exactly-once training by watching
// accepted reports (of Report and of the combined call, shard.ReportAcquirer), and generators of
// synthetic Criteo and libSVM text. The Service wrappers implement shard.ReportAcquirer by
// passing the combined call on with shard.ReportAndAcquire.
//
// Everything here is safe for concurrent use unless its doc says otherwise. Slices returned
// belong to the caller.
package shardtest
