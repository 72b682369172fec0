// Package shardtest is the test kit of package shard: a fake clock and sleeper, a Service
// wrapper that fails on demand (a dispatcher that is down or restarting), a Ledger that checks
// exactly-once training by watching accepted reports, and generators of synthetic Criteo and
// libSVM text.
//
// Everything here is safe for concurrent use unless its doc says otherwise. Slices returned
// belong to the caller.
package shardtest
