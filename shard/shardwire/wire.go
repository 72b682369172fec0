package shardwire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/shard"
)

// ErrMalformed is returned by every Decode function for truncated, oversized or invalid bytes.
var ErrMalformed = errors.New("shardwire: malformed message")

// ErrRemote is matched by the error of a response whose code is Internal: the server failed in
// a way that has no sentinel (the message says how). Readers retry it like a transport error.
var ErrRemote = errors.New("shardwire: remote error")

// version is the first byte of every message.
const version = 1

// Limits on decoded strings, in bytes.
const (
	MaxFile    = 4096 // shard file names
	MaxMessage = 4096 // error messages
)

// Code is the outcome of a call.
type Code uint8

const (
	OK          Code = iota // success
	NoMoreWork              // shard.ErrNoMoreWork
	Wait                    // shard.ErrWait (a *shard.WaitError with RetryAfter)
	StaleLease              // shard.ErrStaleLease
	BadOffset               // shard.ErrBadOffset
	BadWorker               // shard.ErrBadWorker
	Canceled                // context.Canceled or context.DeadlineExceeded on the server
	Internal                // anything else: ErrRemote with the message
	Unsupported             // errors.ErrUnsupported: the server's service cannot make the call
	numCodes
)

// CodeOf returns the code for an error returned by a shard.Service method.
func CodeOf(err error) Code {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, shard.ErrNoMoreWork):
		return NoMoreWork
	case errors.Is(err, shard.ErrWait):
		return Wait
	case errors.Is(err, shard.ErrStaleLease):
		return StaleLease
	case errors.Is(err, shard.ErrBadOffset):
		return BadOffset
	case errors.Is(err, shard.ErrBadWorker):
		return BadWorker
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Canceled
	case errors.Is(err, errors.ErrUnsupported):
		return Unsupported
	}
	return Internal
}

// Status is the response to Report and Leave: a code and the server's error text.
type Status struct {
	Code    Code
	Message string // the server's err.Error(), "" on success
}

// NewStatus returns the status for err.
func NewStatus(err error) Status {
	if err == nil {
		return Status{}
	}
	return Status{Code: CodeOf(err), Message: truncate(err.Error())}
}

// Err returns the error the status stands for: nil, or an error matching the code's sentinel.
func (s Status) Err() error { return codeErr(s.Code, s.Message, 0) }

func codeErr(c Code, msg string, retryAfter time.Duration) error {
	var sentinel error
	switch c {
	case OK:
		return nil
	case NoMoreWork:
		sentinel = shard.ErrNoMoreWork
	case Wait:
		return &shard.WaitError{RetryAfter: retryAfter}
	case StaleLease:
		sentinel = shard.ErrStaleLease
	case BadOffset:
		sentinel = shard.ErrBadOffset
	case BadWorker:
		sentinel = shard.ErrBadWorker
	case Canceled:
		sentinel = context.Canceled
	case Unsupported:
		sentinel = errors.ErrUnsupported
	default:
		sentinel = ErrRemote
	}
	if msg == "" {
		return sentinel
	}
	return fmt.Errorf("%w (remote: %s)", sentinel, msg)
}

func truncate(s string) string {
	if len(s) > MaxMessage {
		return s[:MaxMessage]
	}
	return s
}

// AcquireRequest asks for a shard for Worker.
type AcquireRequest struct {
	Worker string
}

// AcquireResponse answers an AcquireRequest, and a ReportAcquireRequest.
type AcquireResponse struct {
	Code       Code
	Message    string
	RetryAfter time.Duration // Code Wait only
	Lease      shard.Lease   // Code OK only
}

// NewAcquireResponse returns the response for what Service.Acquire (or
// shard.ReportAcquirer.ReportAndAcquire) returned.
func NewAcquireResponse(l shard.Lease, err error) AcquireResponse {
	if err == nil {
		return AcquireResponse{Lease: l}
	}
	r := AcquireResponse{Code: CodeOf(err), Message: truncate(err.Error())}
	var w *shard.WaitError
	if errors.As(err, &w) {
		r.RetryAfter = w.RetryAfter
		r.Message = ""
	}
	return r
}

// Result returns what Service.Acquire (or ReportAndAcquire) returned on the server.
func (r AcquireResponse) Result() (shard.Lease, error) {
	if r.Code != OK {
		return shard.Lease{}, codeErr(r.Code, r.Message, r.RetryAfter)
	}
	return r.Lease, nil
}

// ReportRequest carries the arguments of Service.Report.
type ReportRequest struct {
	Worker string
	Lease  shard.LeaseID
	Offset int64
	Done   bool
}

// ReportAcquireRequest carries the arguments of shard.ReportAcquirer.ReportAndAcquire. It is
// answered by an AcquireResponse: Code OK with the next lease, NoMoreWork or Wait when the
// report was accepted but no shard was leased, StaleLease, BadOffset or BadWorker when nothing
// happened, Unsupported when the server's service cannot combine the calls.
type ReportAcquireRequest struct {
	Worker string
	Lease  shard.LeaseID
	Offset int64 // the shard's record count
}

// LeaveRequest carries the argument of Service.Leave.
type LeaveRequest struct {
	Worker string
}

// AppendAcquireRequest appends r's encoding to dst.
func AppendAcquireRequest(dst []byte, r AcquireRequest) []byte {
	return appendString(append(dst, version), r.Worker)
}

// DecodeAcquireRequest decodes an AcquireRequest from the front of src.
func DecodeAcquireRequest(src []byte) (AcquireRequest, []byte, error) {
	d := decoder{b: src}
	d.version()
	r := AcquireRequest{Worker: d.string("worker", shard.MaxWorkerName)}
	if d.err != nil {
		return AcquireRequest{}, src, d.err
	}
	return r, d.b, nil
}

// AppendLeaveRequest appends r's encoding to dst.
func AppendLeaveRequest(dst []byte, r LeaveRequest) []byte {
	return appendString(append(dst, version), r.Worker)
}

// DecodeLeaveRequest decodes a LeaveRequest from the front of src.
func DecodeLeaveRequest(src []byte) (LeaveRequest, []byte, error) {
	d := decoder{b: src}
	d.version()
	r := LeaveRequest{Worker: d.string("worker", shard.MaxWorkerName)}
	if d.err != nil {
		return LeaveRequest{}, src, d.err
	}
	return r, d.b, nil
}

// AppendReportRequest appends r's encoding to dst.
func AppendReportRequest(dst []byte, r ReportRequest) []byte {
	dst = appendString(append(dst, version), r.Worker)
	dst = appendLeaseID(dst, r.Lease)
	dst = binary.AppendVarint(dst, r.Offset)
	return append(dst, boolByte(r.Done))
}

// DecodeReportRequest decodes a ReportRequest from the front of src.
func DecodeReportRequest(src []byte) (ReportRequest, []byte, error) {
	d := decoder{b: src}
	d.version()
	var r ReportRequest
	r.Worker = d.string("worker", shard.MaxWorkerName)
	r.Lease = d.leaseID()
	r.Offset = d.varint("offset")
	r.Done = d.bool("done")
	if d.err != nil {
		return ReportRequest{}, src, d.err
	}
	return r, d.b, nil
}

// AppendReportAcquireRequest appends r's encoding to dst.
func AppendReportAcquireRequest(dst []byte, r ReportAcquireRequest) []byte {
	dst = appendString(append(dst, version), r.Worker)
	dst = appendLeaseID(dst, r.Lease)
	return binary.AppendVarint(dst, r.Offset)
}

// DecodeReportAcquireRequest decodes a ReportAcquireRequest from the front of src.
func DecodeReportAcquireRequest(src []byte) (ReportAcquireRequest, []byte, error) {
	d := decoder{b: src}
	d.version()
	var r ReportAcquireRequest
	r.Worker = d.string("worker", shard.MaxWorkerName)
	r.Lease = d.leaseID()
	r.Offset = d.varint("offset")
	if d.err != nil {
		return ReportAcquireRequest{}, src, d.err
	}
	return r, d.b, nil
}

// AppendStatus appends s's encoding to dst.
func AppendStatus(dst []byte, s Status) []byte {
	return appendString(append(dst, version, byte(s.Code)), s.Message)
}

// DecodeStatus decodes a Status from the front of src.
func DecodeStatus(src []byte) (Status, []byte, error) {
	d := decoder{b: src}
	d.version()
	var s Status
	s.Code = d.code()
	s.Message = d.string("message", MaxMessage)
	if d.err != nil {
		return Status{}, src, d.err
	}
	return s, d.b, nil
}

// AppendAcquireResponse appends r's encoding to dst.
func AppendAcquireResponse(dst []byte, r AcquireResponse) []byte {
	dst = appendString(append(dst, version, byte(r.Code)), r.Message)
	switch r.Code {
	case Wait:
		dst = binary.AppendVarint(dst, int64(r.RetryAfter))
	case OK:
		dst = appendLease(dst, r.Lease)
	}
	return dst
}

// DecodeAcquireResponse decodes an AcquireResponse from the front of src.
func DecodeAcquireResponse(src []byte) (AcquireResponse, []byte, error) {
	d := decoder{b: src}
	d.version()
	var r AcquireResponse
	r.Code = d.code()
	r.Message = d.string("message", MaxMessage)
	switch r.Code {
	case Wait:
		r.RetryAfter = time.Duration(d.varint("retry after"))
		if d.err == nil && r.RetryAfter < 0 {
			d.fail("negative retry after")
		}
	case OK:
		r.Lease = d.lease()
	}
	if d.err != nil {
		return AcquireResponse{}, src, d.err
	}
	return r, d.b, nil
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

func appendLeaseID(dst []byte, id shard.LeaseID) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id.Incarnation)
	dst = binary.AppendUvarint(dst, id.Seq)
	return binary.AppendUvarint(dst, uint64(id.Shard))
}

func appendLease(dst []byte, l shard.Lease) []byte {
	dst = appendLeaseID(dst, l.ID)
	dst = binary.AppendVarint(dst, int64(l.Epoch))
	s := l.Shard
	dst = binary.AppendVarint(dst, int64(s.Index))
	dst = append(dst, byte(s.Kind))
	dst = appendString(dst, s.File)
	dst = binary.AppendVarint(dst, int64(s.Partition))
	for _, v := range []int64{s.Start, s.End, s.Records, s.Base, s.Line, l.Offset, int64(l.TTL)} {
		dst = binary.AppendVarint(dst, v)
	}
	return binary.LittleEndian.AppendUint64(dst, l.ShuffleSeed)
}

// decoder reads fields; the first problem sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) byte1(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated at %s", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) version() {
	if v := d.byte1("version"); d.err == nil && v != version {
		d.fail("version %d", v)
	}
}

func (d *decoder) code() Code {
	c := Code(d.byte1("code"))
	if d.err == nil && c >= numCodes {
		d.fail("code %d", c)
	}
	return c
}

func (d *decoder) bool(what string) bool {
	v := d.byte1(what)
	if d.err == nil && v > 1 {
		d.fail("%s byte %d", what, v)
	}
	return v == 1
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) { // overflow, truncation or a non-minimal encoding
		d.fail("bad %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 || (n > 1 && d.b[n-1] == 0) { // overflow, truncation or a non-minimal encoding
		d.fail("bad %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) fixed64(what string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail("truncated at %s", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) string(what string, limit int) string {
	n := d.uvarint(what)
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(d.b)) {
		d.fail("%s of %d bytes", what, n)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// int reads a varint that must fit an int in [0, limit].
func (d *decoder) int(what string, limit int64) int {
	v := d.varint(what)
	if d.err == nil && (v < 0 || v > limit) {
		d.fail("%s %d out of range", what, v)
		return 0
	}
	return int(v)
}

func (d *decoder) leaseID() shard.LeaseID {
	var id shard.LeaseID
	id.Incarnation = d.fixed64("incarnation")
	id.Seq = d.uvarint("seq")
	s := d.uvarint("shard")
	if d.err == nil && s > 1<<32-1 {
		d.fail("shard %d", s)
	}
	id.Shard = uint32(s)
	return id
}

func (d *decoder) lease() shard.Lease {
	var l shard.Lease
	l.ID = d.leaseID()
	l.Epoch = d.int("epoch", 1<<31-1)
	s := &l.Shard
	s.Index = d.int("index", 1<<31-1)
	s.Kind = shard.Kind(d.byte1("kind"))
	if d.err == nil && (s.Kind < shard.KindIndexed || s.Kind > shard.KindStream) {
		d.fail("kind %d", s.Kind)
	}
	s.File = d.string("file", MaxFile)
	s.Partition = d.int("partition", 1<<31-1)
	vals := [7]*int64{&s.Start, &s.End, &s.Records, &s.Base, &s.Line, &l.Offset, (*int64)(&l.TTL)}
	for _, p := range vals {
		*p = d.varint("shard range")
	}
	if d.err == nil && (s.Start < 0 || s.End < s.Start || s.Records < 0 || s.Records > shard.MaxShardRecords || l.Offset < 0 || l.Offset > s.Records || l.TTL < 0) {
		d.fail("impossible shard %+v at offset %d", *s, l.Offset)
	}
	l.ShuffleSeed = d.fixed64("shuffle seed")
	return l
}
