package s3

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/repository"
)

// lateRecordFault runs, once, afterPut when the PUT of the object whose
// path ends with suffix has landed, and fails every DELETE of that
// object: a publisher whose record landed slowly and which then cannot
// take it back.
type lateRecordFault struct {
	next     http.RoundTripper
	suffix   atomic.Pointer[string]
	afterPut atomic.Pointer[func()]
}

func (f *lateRecordFault) RoundTrip(req *http.Request) (*http.Response, error) {
	s := f.suffix.Load()
	if s == nil || !strings.HasSuffix(req.URL.Path, *s) {
		return f.next.RoundTrip(req)
	}
	switch req.Method {
	case http.MethodDelete:
		return nil, errors.New("record delete cut off by the test")
	case http.MethodPut:
		resp, err := f.next.RoundTrip(req)
		if hook := f.afterPut.Swap(nil); hook != nil && err == nil {
			(*hook)()
		}
		return resp, err
	}
	return f.next.RoundTrip(req)
}

// TestLateRecordThatCannotBeTakenBackKeepsItsObjects: a publish's record
// lands after half the abandoned grace, meanwhile a sweep found the
// publisher's lease object expired and revoked it (keeping the objects:
// the record was there), so the publisher takes its record back; that
// delete fails. The record then stands, so the failed publish must not
// remove what it names: whatever the publish returns, a record it leaves
// reads back whole.
func TestLateRecordThatCannotBeTakenBackKeepsItsObjects(t *testing.T) {
	needServer(t)
	o := chunkyOptions(t, server.Endpoint, "")
	fault := &lateRecordFault{next: passThrough()}
	o.Transport = fault
	pub := openWith(t, o)
	// Every record lands "late" for the publisher: it checks its lease
	// again after the write.
	pub.abandonedGrace = time.Nanosecond
	co := chunkyOptions(t, server.Endpoint, pub.keys.prefix)
	co.LeaseTTL, co.AbandonedGrace = time.Nanosecond, time.Nanosecond
	collector := openWith(t, co)

	lease := beginCapture(t, pub)
	id := lease.SnapshotID()
	aim(&fault.suffix, pub, pub.keys.record(id))
	sweep := func() {
		if err := collector.Sweep(bg()); err != nil {
			t.Errorf("sweep after the record landed: %v", err)
		}
	}
	fault.afterPut.Store(&sweep)
	in := chunkyInputs(t, 71)
	_, perr := pub.Publish(bg(), lease, in.Request(""))
	if perr == nil {
		t.Fatal("the publish whose lease was revoked before it confirmed its record succeeded")
	}
	t.Logf("the publish: %v", perr)
	if _, err := collector.Get(bg(), id); errors.Is(err, repository.ErrNotFound) {
		t.Skip("the record was taken back after all; the test needs its delete to fail")
	} else if err != nil {
		t.Fatalf("the record left standing does not read: %v", err)
	}
	readsBack(t, collector.keys.prefix, id, in.MemorySHA256)
}

// lostThenDenied is lostAnswer for the PUT of the object whose path ends
// with suffix, and then answers the next GET of it with 403 AccessDenied,
// once: a record whose write landed unheard and which the writer then
// cannot read back.
type lostThenDenied struct {
	lostAnswer
	denied atomic.Bool
}

func (f *lostThenDenied) RoundTrip(req *http.Request) (*http.Response, error) {
	s := f.suffix.Load()
	if s != nil && req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, *s) && f.lost.Load() &&
		f.denied.CompareAndSwap(false, true) {
		deny := &unreadableKey{}
		deny.suffix.Store(s)
		return deny.RoundTrip(req)
	}
	return f.lostAnswer.RoundTrip(req)
}

// TestPublishWhoseRecordLandedUnheardKeepsItsObjects: a publish's record
// lands but its answer is lost, the client's retry finds a record there
// (412), and the read that would tell it is ours fails. The record may
// be ours, so the failed publish must not remove what it names: whatever
// the publish returns, a record it leaves reads back whole.
func TestPublishWhoseRecordLandedUnheardKeepsItsObjects(t *testing.T) {
	needServer(t)
	o := chunkyOptions(t, server.Endpoint, "")
	fault := &lostThenDenied{lostAnswer: lostAnswer{next: passThrough()}}
	o.Transport = fault
	pub := openWith(t, o)
	lease := beginCapture(t, pub)
	id := lease.SnapshotID()
	aim(&fault.suffix, pub, pub.keys.record(id))
	in := chunkyInputs(t, 73)
	_, perr := pub.Publish(bg(), lease, in.Request(""))
	if !fault.lost.Load() || !fault.denied.Load() {
		t.Fatalf("lost %v, denied %v: the test needs both", fault.lost.Load(), fault.denied.Load())
	}
	t.Logf("the publish: %v", perr)
	reader := chunkyRepo(t, pub.keys.prefix)
	if _, err := reader.Get(bg(), id); errors.Is(err, repository.ErrNotFound) {
		return // taken back: nothing names what went
	} else if err != nil {
		t.Fatalf("the record left standing does not read: %v", err)
	}
	readsBack(t, pub.keys.prefix, id, in.MemorySHA256)
}
