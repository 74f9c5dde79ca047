package s3

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// unreadableKey answers every GET or HEAD of the object whose path ends
// with suffix with 403 AccessDenied, as a store whose policy denies the
// reader that one object does, while suffix is set; every other request
// goes to the store.
type unreadableKey struct {
	next   http.RoundTripper
	suffix atomic.Pointer[string]
}

func (f *unreadableKey) RoundTrip(req *http.Request) (*http.Response, error) {
	if s := f.suffix.Load(); s != nil && (req.Method == http.MethodGet || req.Method == http.MethodHead) &&
		strings.HasSuffix(req.URL.Path, *s) {
		body := `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>` +
			`<Message>Access Denied.</Message><Key>` + *s + `</Key></Error>`
		return &http.Response{StatusCode: http.StatusForbidden, Status: "403 Forbidden", Proto: "HTTP/1.1",
			ProtoMajor: 1, ProtoMinor: 1, Request: req, ContentLength: int64(len(body)),
			Header: http.Header{"Content-Type": {"application/xml"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
	}
	return f.next.RoundTrip(req)
}

// leftoverLayer gives snapshot id (a paused child) a layer its record
// does not name, as a retirement that stopped half way leaves one: a
// copy of its own layer's chunk map under another layer name. It returns
// that name.
func leftoverLayer(t *testing.T, r *Repo, id, own string) string {
	t.Helper()
	name := "layer-" + strings.Repeat("0", 64)
	if _, err := r.copyObject(bg(), r.keys.artifact(id, layerChunkMapName(own)), r.keys.artifact(id, layerChunkMapName(name))); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestOneUnreadableSnapshotDoesNotStopTheCollection: snapshot gc over two
// snapshots that each hold a layer left to retire, one of whose records
// the collector cannot read. The sweep and the collection go on past it:
// the other's layer is retired (tombstone first) and the chunks are
// swept; the unreadable one keeps everything; both calls fail with an
// IncompleteError naming that snapshot alone.
func TestOneUnreadableSnapshotDoesNotStopTheCollection(t *testing.T) {
	nodeA := chunkyRepo(t, "")
	base := repotest.PublishBase(t, nodeA, 8*testChunkBytes, "")
	var kids []repotest.Lineage
	var leftovers []string
	for _, pages := range [][]int64{{1, 5}, {2, 6}} {
		kid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: pages}, "")
		own := kid.Record.MemoryLayers[len(kid.Record.MemoryLayers)-1].Name
		kids = append(kids, kid)
		leftovers = append(leftovers, leftoverLayer(t, nodeA, kid.Record.ID, own))
	}
	unreadable, readable := kids[0].Record.ID, kids[1].Record.ID

	o := chunkyOptions(t, server.Endpoint, nodeA.keys.prefix)
	fault := &unreadableKey{next: passThrough()}
	o.Transport = fault
	collector := openWith(t, o)
	aim(&fault.suffix, collector, collector.keys.record(unreadable))

	onlyUnreadable := func(what string, err error) {
		t.Helper()
		var inc *IncompleteError
		if !errors.As(err, &inc) {
			t.Fatalf("%s with one snapshot unreadable: %v, want an IncompleteError", what, err)
		}
		for _, f := range inc.Failed {
			if f.ID != unreadable {
				t.Errorf("%s failed on %s (%v), which it can read", what, f.ID, f)
			}
		}
		if len(inc.Failed) == 0 {
			t.Errorf("%s names no failed snapshot", what)
		}
		t.Logf("%s: %v", what, err)
	}
	onlyUnreadable("the sweep", collector.Sweep(bg()))
	st, err := collector.CollectGarbage(bg())
	onlyUnreadable("the collection", err)
	t.Logf("collection: %+v", st)
	if st.RetiredLayers != 1 || st.Chunks == 0 || st.Live == 0 || len(st.Failed) == 0 {
		t.Errorf("the collection stopped at the unreadable snapshot: %+v", st)
	}
	if got := layerKeys(t, nodeA, readable, leftovers[1]); len(got) != 0 {
		t.Errorf("the readable snapshot's leftover layer stayed: %v", got)
	}
	if got := present(t, nodeA, []string{strings.TrimPrefix(nodeA.keys.layerTombstone(readable, leftovers[1]), nodeA.keys.prefix)}); len(got) != 1 {
		t.Errorf("the readable snapshot's leftover layer went without a tombstone")
	}
	if got := layerKeys(t, nodeA, unreadable, leftovers[0]); len(got) == 0 {
		t.Errorf("the unreadable snapshot's leftover layer was retired")
	}

	fault.suffix.Store(nil)
	snapshotGC(t, collector)
	if got := layerKeys(t, nodeA, unreadable, leftovers[0]); len(got) != 0 {
		t.Errorf("readable again, the snapshot's leftover layer stayed: %v", got)
	}
	for _, kid := range kids {
		readsBack(t, nodeA.keys.prefix, kid.Record.ID, repotest.SHA256Hex(kid.Memory))
	}
}

// lostAnswer delivers the first PUT of the object whose path ends with
// suffix (once suffix is set) to the store and then reports the
// connection reset, as a store whose answer never arrived: the write
// landed, the writer does not know.
type lostAnswer struct {
	next   http.RoundTripper
	suffix atomic.Pointer[string]
	lost   atomic.Bool
}

func (f *lostAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	s := f.suffix.Load()
	if s == nil || req.Method != http.MethodPut || !strings.HasSuffix(req.URL.Path, *s) || f.lost.Load() {
		return f.next.RoundTrip(req)
	}
	resp, err := f.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.lost.Store(true)
	return nil, errors.New("read: connection reset by peer (the test lost the answer)")
}

// TestFlattenWhoseRecordAnswerIsLost: a flatten's record lands but its
// answer is lost (the client's retry then finds the record changed). The
// snapshot must still read back whole: the flatten must not take the
// record it wrote for another's and remove the memory that record names.
func TestFlattenWhoseRecordAnswerIsLost(t *testing.T) {
	nodeA := chunkyRepo(t, "")
	base := repotest.PublishBase(t, nodeA, 8*testChunkBytes, "")
	mid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
	leaf := repotest.PublishChild(t, nodeA, mid, repotest.Change{Pages: []int64{2, 5, 30}}, "")

	o := chunkyOptions(t, server.Endpoint, nodeA.keys.prefix)
	fault := &lostAnswer{next: passThrough()}
	o.Transport = fault
	flattener := openWith(t, o)
	aim(&fault.suffix, flattener, flattener.keys.record(leaf.Record.ID))
	lease, err := flattener.LeaseExisting(bg(), leaf.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	flat, err := flattener.ReplaceMemory(bg(), lease, repository.ReplaceMemoryRequest{Expect: leaf.Record, Layer: mergedLayer(t, base.Memory, leaf.Memory)})
	lease.End()
	if !fault.lost.Load() {
		t.Fatal("no record write's answer was lost")
	}
	t.Logf("the flatten: depth %d, %v", flat.Depth(), err)
	if err != nil {
		t.Errorf("a flatten whose record landed reports %v", err)
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
	collector := chunkyRepo(t, nodeA.keys.prefix)
	collector.chunkGrace = time.Nanosecond
	snapshotGC(t, collector)
	if left := unneededKeys(t, nodeA); len(left) != 0 {
		t.Errorf("the bucket holds unneeded %v", left)
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
}

// TestLeaseWriteWhoseAnswerIsLostStaysHeld: a write of a lease object
// (a renewal, a confirmation before a record) lands but its answer is
// lost, and the client's retry finds the object changed, by that write.
// The lease is still its holder's: the next confirmation succeeds.
func TestLeaseWriteWhoseAnswerIsLostStaysHeld(t *testing.T) {
	needServer(t)
	o := testOptions(t, server.Endpoint)
	fault := &lostAnswer{next: passThrough()}
	o.Transport = fault
	r := openWith(t, o)
	lease := beginCapture(t, r)
	id := lease.SnapshotID()
	aim(&fault.suffix, r, r.heldLease(id).key)
	if err := r.confirmLease(bg(), id); err != nil {
		t.Errorf("a confirmation whose answer was lost: %v", err)
	}
	if !fault.lost.Load() {
		t.Fatal("no lease write's answer was lost")
	}
	if err := r.confirmLease(bg(), id); err != nil {
		t.Errorf("the confirmation after it: %v", err)
	}
}
