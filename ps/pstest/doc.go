// Package pstest runs parameter-server clusters in memory for tests: n servers on an in-memory
// network (package memnet's faults apply: partition, drop, delay, kill), an owner table published
// to them and to a TableHolder, and clients on their own hosts. Everything is stopped when the
// test ends.
//
// A Cluster is used from the test goroutine; the servers and clients it makes are safe for
// concurrent use.
package pstest
