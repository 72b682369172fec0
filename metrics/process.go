package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// RegisterProcess registers on reg the process's series, with cfg's constant labels: its CPU
// time, resident and virtual memory, open files and start time from /proc
// (process_cpu_seconds_total, process_resident_memory_bytes, ...), and the Go runtime's
// (go_goroutines, go_memstats_..., go_gc_duration_seconds, ...). Register them once per
// registry: a process that runs several roles (a coordinator with its servers) names one of
// them, or none, in cfg. On a system without /proc the process series are those it can read.
func RegisterProcess(reg prometheus.Registerer, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	r := prometheus.WrapRegistererWith(cfg.labels(), reg)
	if err := r.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return err
	}
	return r.Register(collectors.NewGoCollector())
}
