package shardwire_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
	"github.com/elasticps/elasticps/shard/shardwire"
)

// loopback is a shard.Service that goes through the codecs: what a network adapter does, minus
// the network.
type loopback struct {
	d    *shard.Dispatcher
	hide bool // serve as if the dispatcher had no combined call
}

func (l loopback) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	req, _, err := shardwire.DecodeAcquireRequest(shardwire.AppendAcquireRequest(nil, shardwire.AcquireRequest{Worker: worker}))
	if err != nil {
		return shard.Lease{}, err
	}
	wire := shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(l.d.Acquire(ctx, req.Worker)))
	resp, rest, err := shardwire.DecodeAcquireResponse(wire)
	if err != nil || len(rest) != 0 {
		return shard.Lease{}, errors.Join(err, errors.New("trailing bytes"))
	}
	return resp.Result()
}

func (l loopback) Report(ctx context.Context, worker string, id shard.LeaseID, offset int64, done bool) error {
	req, _, err := shardwire.DecodeReportRequest(shardwire.AppendReportRequest(nil, shardwire.ReportRequest{Worker: worker, Lease: id, Offset: offset, Done: done}))
	if err != nil {
		return err
	}
	st, _, err := shardwire.DecodeStatus(shardwire.AppendStatus(nil, shardwire.NewStatus(l.d.Report(ctx, req.Worker, req.Lease, req.Offset, req.Done))))
	if err != nil {
		return err
	}
	return st.Err()
}

func (l loopback) ReportAndAcquire(ctx context.Context, worker string, id shard.LeaseID, offset int64) (shard.Lease, error) {
	req, _, err := shardwire.DecodeReportAcquireRequest(shardwire.AppendReportAcquireRequest(nil, shardwire.ReportAcquireRequest{Worker: worker, Lease: id, Offset: offset}))
	if err != nil {
		return shard.Lease{}, err
	}
	wire := shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(shard.ReportAndAcquire(ctx, l.svc(), req.Worker, req.Lease, req.Offset)))
	resp, rest, err := shardwire.DecodeAcquireResponse(wire)
	if err != nil || len(rest) != 0 {
		return shard.Lease{}, errors.Join(err, errors.New("trailing bytes"))
	}
	return resp.Result()
}

// svc is the dispatcher, without its combined call when hide is set.
func (l loopback) svc() shard.Service {
	if l.hide {
		return struct{ shard.Service }{l.d}
	}
	return l.d
}

func (l loopback) Leave(ctx context.Context, worker string) error {
	req, _, err := shardwire.DecodeLeaveRequest(shardwire.AppendLeaveRequest(nil, shardwire.LeaveRequest{Worker: worker}))
	if err != nil {
		return err
	}
	st, _, err := shardwire.DecodeStatus(shardwire.AppendStatus(nil, shardwire.NewStatus(l.d.Leave(ctx, req.Worker))))
	if err != nil {
		return err
	}
	return st.Err()
}

func TestReaderOverCodecs(t *testing.T) {
	clock := shardtest.NewClock(time.Unix(0, 0))
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(500), ShardSize: 64, Epochs: 2, Shuffle: true, ShuffleRecords: true, Clock: clock, Incarnation: 7})
	if err != nil {
		t.Fatal(err)
	}
	ledger := shardtest.NewLedger()
	data := shard.IndexedFunc(500, func(i int64, rec *shard.Record) error { rec.Label = float32(i); return nil })
	r, err := shard.NewReader(shard.ReaderConfig{Service: ledger.Wrap(loopback{d: d}), Worker: "w", Source: shard.IndexedSource{Data: data}, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := 0
	for {
		b, err := r.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n += b.Len()
		if err := r.Done(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := ledger.Check(d.Progress()); err != nil || n != 1000 {
		t.Fatalf("%v, %d records", err, n)
	}
	if st := r.Stats(); st.Combined != 16 || st.Leases != 16 {
		t.Fatalf("stats %+v: every shard should end with the combined call", st)
	}
}

func TestErrorsSurviveTheWire(t *testing.T) {
	ctx := context.Background()
	clock := shardtest.NewClock(time.Unix(0, 0))
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, Clock: clock, RetryAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	svc := loopback{d: d}
	l, err := svc.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.Acquire(ctx, "b")
	var we *shard.WaitError
	if !errors.As(err, &we) || we.RetryAfter != 3*time.Second {
		t.Fatalf("wait: %v", err)
	}
	if err := svc.Report(ctx, "b", l.ID, 1, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("stale: %v", err)
	}
	if err := svc.Report(ctx, "a", l.ID, 11, false); !errors.Is(err, shard.ErrBadOffset) {
		t.Fatalf("offset: %v", err)
	}
	if _, err := svc.Acquire(ctx, ""); !errors.Is(err, shard.ErrBadWorker) {
		t.Fatalf("worker: %v", err)
	}
	if _, err := svc.ReportAndAcquire(ctx, "b", l.ID, 10); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("combined, stale: %v", err)
	}
	if _, err := svc.ReportAndAcquire(ctx, "a", l.ID, 9); !errors.Is(err, shard.ErrBadOffset) {
		t.Fatalf("combined, offset: %v", err)
	}
	if _, err := (loopback{d: d, hide: true}).ReportAndAcquire(ctx, "a", l.ID, 10); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("combined, unsupported: %v", err)
	}
	if _, err := svc.ReportAndAcquire(ctx, "a", l.ID, 10); !errors.Is(err, shard.ErrNoMoreWork) {
		t.Fatalf("combined, no more work: %v", err)
	}
	if err := svc.Report(ctx, "a", l.ID, 10, true); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("report after the combined call: %v", err)
	}
	if _, err := svc.Acquire(ctx, "a"); !errors.Is(err, shard.ErrNoMoreWork) {
		t.Fatalf("no more work: %v", err)
	}
	if err := svc.Leave(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := shardwire.NewStatus(errors.New("disk on fire")).Err(); !errors.Is(err, shardwire.ErrRemote) {
		t.Fatalf("internal: %v", err)
	}
	if err := shardwire.NewStatus(context.DeadlineExceeded).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

func sampleLease() shard.Lease {
	return shard.Lease{
		ID:     shard.LeaseID{Incarnation: 0xdeadbeef, Seq: 12345, Shard: 77},
		Epoch:  3,
		Shard:  shard.Shard{Index: 77, Kind: shard.KindText, File: "day_0.tsv", Start: 1 << 33, End: 1<<33 + 999, Records: 10, Base: 770, Line: 7701},
		Offset: 4, TTL: 30 * time.Second, ShuffleSeed: 0xfeedface,
	}
}

func TestRoundTrips(t *testing.T) {
	resp := shardwire.AcquireResponse{Lease: sampleLease()}
	b := shardwire.AppendAcquireResponse([]byte("prefix"), resp)
	got, rest, err := shardwire.DecodeAcquireResponse(b[len("prefix"):])
	if err != nil || len(rest) != 0 || got != resp {
		t.Fatalf("%v %+v", err, got)
	}
	rr := shardwire.ReportRequest{Worker: "w-1", Lease: resp.Lease.ID, Offset: 9, Done: true}
	b = append(shardwire.AppendReportRequest(nil, rr), 0xAA)
	gotR, rest, err := shardwire.DecodeReportRequest(b)
	if err != nil || !bytes.Equal(rest, []byte{0xAA}) || gotR != rr {
		t.Fatalf("%v %+v", err, gotR)
	}
	for i := range b[:len(b)-1] {
		if _, _, err := shardwire.DecodeReportRequest(b[:i]); !errors.Is(err, shardwire.ErrMalformed) {
			t.Fatalf("truncated at %d: %v", i, err)
		}
	}
	ra := shardwire.ReportAcquireRequest{Worker: "w-2", Lease: resp.Lease.ID, Offset: 10}
	b = append(shardwire.AppendReportAcquireRequest(nil, ra), 0xBB)
	gotRA, rest, err := shardwire.DecodeReportAcquireRequest(b)
	if err != nil || !bytes.Equal(rest, []byte{0xBB}) || gotRA != ra {
		t.Fatalf("%v %+v", err, gotRA)
	}
	for i := range b[:len(b)-1] {
		if _, _, err := shardwire.DecodeReportAcquireRequest(b[:i]); !errors.Is(err, shardwire.ErrMalformed) {
			t.Fatalf("truncated at %d: %v", i, err)
		}
	}
	unsupported := shardwire.NewAcquireResponse(shard.Lease{}, fmt.Errorf("no: %w", errors.ErrUnsupported))
	b = shardwire.AppendAcquireResponse(nil, unsupported)
	gotU, _, err := shardwire.DecodeAcquireResponse(b)
	if _, rerr := gotU.Result(); err != nil || gotU.Code != shardwire.Unsupported || !errors.Is(rerr, errors.ErrUnsupported) {
		t.Fatalf("unsupported: %v %+v %v", err, gotU, rerr)
	}
}

func FuzzAcquireResponse(f *testing.F) {
	f.Add(shardwire.AppendAcquireResponse(nil, shardwire.AcquireResponse{Lease: sampleLease()}))
	f.Add(shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(shard.Lease{}, &shard.WaitError{RetryAfter: time.Second})))
	f.Add(shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(shard.Lease{}, shard.ErrNoMoreWork)))
	f.Add(shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(shard.Lease{}, errors.ErrUnsupported)))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, rest, err := shardwire.DecodeAcquireResponse(b)
		if err != nil {
			return
		}
		again := shardwire.AppendAcquireResponse(nil, r)
		if !bytes.Equal(again, b[:len(b)-len(rest)]) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b[:len(b)-len(rest)])
		}
		if _, err := r.Result(); (err == nil) != (r.Code == shardwire.OK) {
			t.Fatalf("result %v for code %d", err, r.Code)
		}
	})
}

func FuzzRequests(f *testing.F) {
	f.Add(shardwire.AppendReportRequest(nil, shardwire.ReportRequest{Worker: "w", Lease: sampleLease().ID, Offset: -3}))
	f.Add(shardwire.AppendAcquireRequest(nil, shardwire.AcquireRequest{Worker: "worker-7"}))
	f.Add(shardwire.AppendStatus(nil, shardwire.NewStatus(shard.ErrStaleLease)))
	f.Add(shardwire.AppendReportAcquireRequest(nil, shardwire.ReportAcquireRequest{Worker: "w", Lease: sampleLease().ID, Offset: 10}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, rest, err := shardwire.DecodeReportRequest(b); err == nil {
			if again := shardwire.AppendReportRequest(nil, r); !bytes.Equal(again, b[:len(b)-len(rest)]) {
				t.Fatalf("report: %x vs %x", again, b)
			}
		}
		if r, rest, err := shardwire.DecodeReportAcquireRequest(b); err == nil {
			if again := shardwire.AppendReportAcquireRequest(nil, r); !bytes.Equal(again, b[:len(b)-len(rest)]) {
				t.Fatalf("report and acquire: %x vs %x", again, b)
			}
		}
		if r, rest, err := shardwire.DecodeAcquireRequest(b); err == nil {
			if again := shardwire.AppendAcquireRequest(nil, r); !bytes.Equal(again, b[:len(b)-len(rest)]) {
				t.Fatalf("acquire: %x vs %x", again, b)
			}
		}
		if r, rest, err := shardwire.DecodeLeaveRequest(b); err == nil {
			if again := shardwire.AppendLeaveRequest(nil, r); !bytes.Equal(again, b[:len(b)-len(rest)]) {
				t.Fatalf("leave: %x vs %x", again, b)
			}
		}
		if s, rest, err := shardwire.DecodeStatus(b); err == nil {
			if again := shardwire.AppendStatus(nil, s); !bytes.Equal(again, b[:len(b)-len(rest)]) {
				t.Fatalf("status: %x vs %x", again, b)
			}
		}
	})
}
