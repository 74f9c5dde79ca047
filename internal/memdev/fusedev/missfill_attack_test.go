package fusedev

import (
	"os"
	"sync"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// TestMissFillStopsAtTheDeviceEnd: a device whose size is not a multiple
// of the fill window; a miss on its last page fills only what lies
// before it, and a run of misses up to the end never fills past it, and
// every page reads back the lower file's bytes.
func TestMissFillStopsAtTheDeviceEnd(t *testing.T) {
	const (
		fileBytes = 1<<20 + 5*pageBytes
		window    = 128 << 10
	)
	d, lower, events := missFillDevice(t, fileBytes, window)
	last := int64(fileBytes - pageBytes)
	faultAndFill(t, d, events, fileBytes, last, last-window/2, fileBytes, window/2)

	// A run that reaches the end: each fill stops there.
	miss := int64(fileBytes - 5*window/2)
	miss &^= pageBytes - 1
	faultAndFill(t, d, events, fileBytes, miss, miss-window/2, miss+window/2, window-pageBytes)
	end := miss + window/2
	faultAndFill(t, d, events, fileBytes, end, end+pageBytes, fileBytes, int(last-window/2-end-pageBytes))
	var all []int64
	for off := int64(0); off < fileBytes; off += pageBytes {
		all = append(all, off)
	}
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: all})
	if want := lowerHash(t, lower, all, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("whole device after fills at its end: %+v, want hash %s", res, want)
	}
}

// TestRandomMissesKeepTheirWindow: single-page misses far apart are each
// isolated: a centred window each, never a run's growing forward fill.
func TestRandomMissesKeepTheirWindow(t *testing.T) {
	const (
		fileBytes = 32 << 20
		window    = 128 << 10
	)
	d, _, events := missFillDevice(t, fileBytes, window)
	for _, miss := range []int64{17 << 20, 3 << 20, 29 << 20, 9 << 20, 3<<20 + 3*window, 22 << 20} {
		faultAndFill(t, d, events, fileBytes, miss, miss-window/2, miss+window/2, window-pageBytes)
	}
}

// TestMissFillNeverServesACorruptBlock: a block that fails its digest
// inside the range a run's forward fill covers is never stored: the fill
// stops there, the guest's read of that page fails, the pages before it
// read back right, and the device reports the block.
func TestMissFillNeverServesACorruptBlock(t *testing.T) {
	const (
		fileBytes = 8 << 20
		window    = 128 << 10
	)
	lower := writeLower(t, fileBytes, 35)
	data, err := os.ReadFile(lower)
	if err != nil {
		t.Fatal(err)
	}
	b := integrity.NewBuilder(integrity.SHA256, fileBytes)
	b.Write(data)
	miss := int64(2 << 20)
	bad := miss + window/2 + window // inside the run's second fill
	f, err := os.OpenFile(lower, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^data[bad+100]}, bad+100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	srv := missFillServer(t, window)
	events := make(servedEvents, 1024)
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = events
	req.Verifier = &memdev.Verifier{Table: b.Table()}
	d, err := srv.Attach("bad", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	held, err := os.Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	faultAndFill(t, d, events, fileBytes, miss, miss-window/2, miss+window/2, window-pageBytes)
	end := miss + window/2
	// The run's next fill covers [end+page, end+2*window) and meets the
	// bad block: only the first pages after the miss are stored.
	faultAndFill(t, d, events, fileBytes, end, end+pageBytes, bad, missFillFirstBytes)

	l := layout.Single(fileBytes)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: []int64{bad}}); res.Err == "" {
		t.Fatalf("a read of the corrupt block succeeded (hash %s)", res.Hash)
	}
	var good []int64
	for off := end; off < bad; off += pageBytes {
		good = append(good, off)
	}
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: good}); res.Err != "" || res.Hash != lowerHash(t, lower, good, pageBytes) {
		t.Fatalf("pages before the corrupt block: %+v", res)
	}
	if d.Corruption() == nil {
		t.Fatal("the device reports no corrupt block")
	}
}

// gateLower is a lower file whose reads in [lo, hi) wait at a gate, and
// which notes a read after it was closed.
type gateLower struct {
	*os.File
	lo, hi  int64
	entered chan struct{}
	open    chan struct{}
	once    sync.Once

	mu              sync.Mutex
	closed, lateUse bool
}

func (g *gateLower) ReadAt(p []byte, off int64) (int, error) {
	if off < g.hi && off+int64(len(p)) > g.lo {
		g.once.Do(func() { close(g.entered) })
		<-g.open
	}
	g.mu.Lock()
	g.lateUse = g.lateUse || g.closed
	g.mu.Unlock()
	return g.File.ReadAt(p, off)
}

func (g *gateLower) Size() int64 {
	st, err := g.File.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}

// Advise makes the gate a local lower: only those are filled around a miss.
func (g *gateLower) Advise(int64, int64) error { return nil }

func (g *gateLower) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	return g.File.Close()
}

// TestReleaseWaitsForAMissFill: the release of a generation whose miss
// fill is still reading waits for it, and the lower is closed only after
// that read returned (never read once closed).
func TestReleaseWaitsForAMissFill(t *testing.T) {
	const (
		fileBytes = 4 << 20
		window    = 128 << 10
	)
	path := writeLower(t, fileBytes, 36)
	miss := int64(1 << 20)
	gl := &gateLower{lo: miss + pageBytes, hi: miss + window/2, entered: make(chan struct{}), open: make(chan struct{})}
	open := func() (memdev.Lower, error) {
		f, err := os.Open(path)
		gl.File = f
		return gl, err
	}
	srv := missFillServer(t, window)
	d, err := srv.Attach("gated", lowerReq("gated:"+path, open, memdev.IOEngineBuffered))
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: []int64{miss}}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	<-gl.entered // the fill after the miss is reading
	held.Close()
	ack := d.release()
	select {
	case <-ack:
		t.Fatal("the release was acknowledged while a miss fill was reading")
	default:
	}
	close(gl.open)
	waitAck(t, ack)
	gl.mu.Lock()
	defer gl.mu.Unlock()
	if !gl.closed || gl.lateUse {
		t.Fatalf("lower closed %v, read after close %v; want closed, never read after", gl.closed, gl.lateUse)
	}
}

// TestWritableViewGetsNoMissFill: a writable view's page cache holds the
// guest's writes, so a demand miss on it is never filled around.
func TestWritableViewGetsNoMissFill(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 37)
	srv := newServer(t, Options{ReadAheadBytes: pageBytes, MissFillBytes: 128 << 10, AllowWriteOpen: true})
	events := make(servedEvents, 64)
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Writable, req.RunDir, req.Observer = true, t.TempDir(), events
	view, err := srv.Attach("view", req)
	if err != nil {
		t.Fatal(err)
	}
	miss := int64(1 << 20)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: view.Path(), Layout: layout.Single(fileBytes), Pages: []int64{miss}}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if e := waitServed(t, events); e.kind != memdev.Demand || e.off != miss {
		t.Fatalf("event %+v, want the demand read at %d", e, miss)
	}
	waitAck(t, view.release()) // waits for any fill in flight
	close(events)
	for e := range events {
		if e.kind != memdev.Demand {
			t.Fatalf("a writable view was filled around a miss: %+v", e)
		}
	}
}
