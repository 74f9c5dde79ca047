package memdev

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/prefetch"
	"warmstart/internal/untrusted"
)

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func tableOf(data []byte) *integrity.Table {
	b := integrity.NewBuilder(integrity.SHA256, int64(len(data)))
	b.Write(data)
	return b.Table()
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "memory.bin")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGenerationReadsEndWithTheirLastRestore: the reads of a lower shared by two
// restores go on when one of them leaves, end with the cause of the last
// one to leave, and a restore joining after that reads under a context of
// its own.
func TestGenerationReadsEndWithTheirLastRestore(t *testing.T) {
	s := NewReadScope()
	s.bind()
	s.Join()
	s.Join()
	ctx := s.Context()
	first, last := errors.New("restore A is over"), errors.New("restore B is over")
	if s.Leave(first) {
		t.Fatal("the first of two holders to leave ended the reads")
	}
	if ctx.Err() != nil {
		t.Fatalf("the reads of the holder still running ended: %v", context.Cause(ctx))
	}
	if !s.Leave(last) {
		t.Fatal("the last holder to leave did not end the reads")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, last) {
		t.Fatalf("the reads ended with %v, want %v", cause, last)
	}
	if s.Context().Err() == nil {
		t.Fatal("a read starting after the last holder left would not end")
	}
	s.Join()
	if got := s.Context(); got.Err() != nil {
		t.Fatalf("a holder joining after the others left reads under an ended context: %v", context.Cause(got))
	}
}

// TestScopeOfALocalFileNeverEndsReads: a lower whose reads take no
// context is never reported as having had its reads ended.
func TestScopeOfALocalFileNeverEndsReads(t *testing.T) {
	s := NewReadScope()
	s.Join()
	if s.Leave(errors.New("over")) {
		t.Fatal("Leave reported ending the reads of a lower that cannot end them")
	}
}

// stuckLower is a ContextReaderAt whose reads wait for their context, an
// integrity.Uncacher that records what it was asked to drop, and a lower
// that fails reads at failAt.
type stuckLower struct {
	data     []byte
	failAt   int64
	failWith error
	entered  chan struct{}
	uncached atomic.Int64
	closed   atomic.Bool
}

func (l *stuckLower) ReadAt(p []byte, off int64) (int, error) {
	return l.ReadAtContext(context.Background(), p, off)
}

func (l *stuckLower) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if l.entered != nil {
		close(l.entered)
		<-ctx.Done()
		return 0, context.Cause(ctx)
	}
	if l.failWith != nil && off <= l.failAt && l.failAt < off+int64(len(p)) {
		return 0, l.failWith
	}
	return copy(p, l.data[off:]), nil
}

func (l *stuckLower) Size() int64               { return int64(len(l.data)) }
func (l *stuckLower) Close() error              { l.closed.Store(true); return nil }
func (l *stuckLower) Uncache(off, length int64) { l.uncached.Add(1) }
func (l *stuckLower) Refuse(off, length int64)  {}
func (l *stuckLower) source() Source            { return lowerSource{l} }
func (s lowerSource) Ref() string               { return "test-lower" }
func (s lowerSource) Open() (Lower, error)      { return s.l, nil }

type lowerSource struct{ l Lower }

// TestMemoryReadsEndWithTheScope: a read of a lower waiting on its store
// returns once the last holder of the scope leaves, with its cause.
func TestMemoryReadsEndWithTheScope(t *testing.T) {
	l := &stuckLower{data: make([]byte, 8192), entered: make(chan struct{})}
	scope := NewReadScope()
	scope.Join()
	m, err := OpenMemory(Request{Memory: l.source()}, scope)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.ReadAt(make([]byte, 4096), 0)
		errc <- err
	}()
	<-l.entered
	cause := errors.New("restore over")
	if !scope.Leave(cause) {
		t.Fatal("leaving the scope of a lower on a store did not say it ended the reads")
	}
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Fatalf("read ended with %v, want %v", err, cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the read did not end with its scope")
	}
	if m.Close(); !l.closed.Load() {
		t.Fatal("Close did not close the lower")
	}
}

// TestMemoryServesOnlyVerifiedBytes: a bad block is refused, told to
// OnCorrupt, and a lower that keeps a copy is asked to drop it; the
// lower's own failed reads go to OnReadError.
func TestMemoryServesOnlyVerifiedBytes(t *testing.T) {
	good := randomBytes(4*integrity.BlockBytes, 3)
	bad := append([]byte(nil), good...)
	bad[2*integrity.BlockBytes+9] ^= 1
	l := &stuckLower{data: bad}
	var corrupt atomic.Int32
	m, err := OpenMemory(Request{Memory: l.source(),
		Verifier: &Verifier{Table: tableOf(good), OnCorrupt: func(*integrity.BlockError) { corrupt.Add(1) }}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Verified() {
		t.Fatal("a memory with a verifier says it is unverified")
	}
	p := make([]byte, len(good))
	n, err := m.ReadAt(p, 0)
	if !errors.Is(err, integrity.ErrCorrupt) || n != 2*integrity.BlockBytes || !bytes.Equal(p[:n], good[:n]) {
		t.Fatalf("read over a bad block: n %d, err %v; want the 2 good blocks and ErrCorrupt", n, err)
	}
	if corrupt.Load() != 1 || l.uncached.Load() == 0 {
		t.Fatalf("bad block told %d times, lower asked to drop its copy %d times; want once and at least once",
			corrupt.Load(), l.uncached.Load())
	}

	failing := &stuckLower{data: good, failAt: integrity.BlockBytes, failWith: errors.New("store: object missing")}
	var told []error
	m, err = OpenMemory(Request{Memory: failing.source(), OnReadError: func(err error) { told = append(told, err) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Verified() {
		t.Fatal("a memory without a verifier says it is verified")
	}
	if _, err := m.ReadAt(make([]byte, 4096), integrity.BlockBytes); err == nil {
		t.Fatal("failed read returned no error")
	}
	if _, err := m.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 || !errors.Is(told[0], failing.failWith) {
		t.Fatalf("OnReadError told %v, want the one failed read", told)
	}
}

// TestMemoryRefusesALowerOfAnotherSize: a lower whose size is not its
// table's is refused, and closed.
func TestMemoryRefusesALowerOfAnotherSize(t *testing.T) {
	data := randomBytes(3*integrity.BlockBytes, 4)
	l := &stuckLower{data: data[:2*integrity.BlockBytes]}
	_, err := OpenMemory(Request{Memory: l.source(), Verifier: &Verifier{Table: tableOf(data)}}, nil)
	if !errors.Is(err, integrity.ErrSizeChanged) {
		t.Fatalf("open of a shorter lower: %v, want ErrSizeChanged", err)
	}
	if !l.closed.Load() {
		t.Fatal("the refused lower was left open")
	}
}

// TestFileAdvisesAndReportsItsFile: File's lower reaches the page cache
// through Memory.Advise (so hints and readaround are not silently off),
// carries the file's ModTime, and is named by its absolute path.
func TestFileAdvisesAndReportsItsFile(t *testing.T) {
	data := randomBytes(64<<10, 5)
	path := writeFile(t, data)
	when := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
	src := File(path)
	if src.Ref() != path || !filepath.IsAbs(src.Ref()) {
		t.Fatalf("Ref %q, want the absolute path %q", src.Ref(), path)
	}
	m, err := OpenMemory(Request{Memory: src, Verifier: &Verifier{Table: tableOf(data)}}, NewReadScope())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.Advisable() {
		t.Fatal("a local file's memory cannot be advised")
	}
	if err := m.Advise(0, int64(len(data))); err != nil {
		t.Fatalf("advise: %v", err)
	}
	if !m.ModTime().Equal(when) {
		t.Fatalf("ModTime %v, want the file's %v", m.ModTime(), when)
	}
	got := make([]byte, len(data))
	if n, err := m.ReadAt(got, 0); n != len(data) || (err != nil && err != io.EOF) || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want the file", n, err)
	}
	var hinted []prefetch.Range
	Hint(func(off, length int64) error {
		hinted = append(hinted, prefetch.Range{Offset: off, Length: length})
		if len(hinted) == 2 {
			return errors.New("stop")
		}
		return nil
	}, []prefetch.Range{{Offset: 0, Length: 4096}, {Offset: 8192, Length: 4096}, {Offset: 16384, Length: 4096}})
	if len(hinted) != 2 {
		t.Fatalf("Hint went on after a failed advice: %v", hinted)
	}
}

// TestFileRefusesWhatIsNotARegularFile: a FIFO in place of the memory
// file is refused at once (an open of it would wait for a writer).
func TestFileRefusesWhatIsNotARegularFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "memory.bin")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := File(fifo).Open()
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, untrusted.ErrNotRegular) {
			t.Fatalf("open of a FIFO: %v, want untrusted.ErrNotRegular", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("open of a FIFO hangs")
	}
}

type kindOpener string

func (k kindOpener) Kind() string                 { return string(k) }
func (k kindOpener) Open(Request) (Device, error) { return nil, nil }

// TestDevicesNameTheirKinds: an empty kind is the first opener, an unknown
// one is refused naming those there are.
func TestDevicesNameTheirKinds(t *testing.T) {
	ds := Devices{kindOpener(KindFile), kindOpener(KindUffd)}
	if o, err := ds.Opener(""); err != nil || o.Kind() != KindFile {
		t.Fatalf("default opener %v, %v; want the file device", o, err)
	}
	if o, err := ds.Opener(KindUffd); err != nil || o.Kind() != KindUffd {
		t.Fatalf("uffd opener %v, %v", o, err)
	}
	_, err := ds.Opener("ublk")
	if !errors.Is(err, ErrUnknownDevice) || err.Error() != `unknown memory device "ublk" (want file or uffd)` {
		t.Fatalf("unknown kind: %v", err)
	}
	if ValidIOEngine(-1) || ValidIOEngine(3) || !ValidIOEngine(IOEngineDirect) {
		t.Fatal("ValidIOEngine does not accept exactly 0, 1 and 2")
	}
}

// precheckingLower is a stuckLower that says it checked every block of
// its bytes against table itself (a ContextPrechecker), and records the
// context of its prechecked reads.
type precheckingLower struct {
	stuckLower
	table *integrity.Table
	ctxs  []context.Context
}

func (l *precheckingLower) ReadAtPrecheckedContext(ctx context.Context, p []byte, off int64, t *integrity.Table, checked []bool) (int, error) {
	l.ctxs = append(l.ctxs, ctx)
	if t.Equal(l.table) {
		for k := range checked {
			checked[k] = true
		}
	}
	return l.ReadAtContext(ctx, p, off)
}

func (l *precheckingLower) source() Source { return lowerSource{l} }

// TestMemoryTakesPrecheckedBlocksUnhashed: a lower that checked its
// blocks against the memory's table itself has them served without a
// second hash, its reads run under the generation's scope, and its failed
// reads are told to OnReadError as any lower's are.
func TestMemoryTakesPrecheckedBlocksUnhashed(t *testing.T) {
	good := randomBytes(4*integrity.BlockBytes, 5)
	table := tableOf(good)
	l := &precheckingLower{stuckLower: stuckLower{data: good, failAt: 3 * integrity.BlockBytes, failWith: errors.New("store down")}, table: table}
	scope := NewReadScope()
	scope.Join()
	var told []error
	m, err := OpenMemory(Request{Memory: l.source(), Verifier: &Verifier{Table: table},
		OnReadError: func(err error) { told = append(told, err) }}, scope)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	before := integrity.SHA256Hashed()
	p := make([]byte, 3*integrity.BlockBytes)
	if n, err := m.ReadAt(p, 0); err != nil || n != len(p) || !bytes.Equal(p, good[:len(p)]) {
		t.Fatalf("read %d bytes, %v; want the memory's", n, err)
	}
	if hashed := integrity.SHA256Hashed() - before; hashed != 0 {
		t.Fatalf("hashed %d bytes the lower had checked", hashed)
	}
	if len(l.ctxs) != 1 || l.ctxs[0] != scope.Context() {
		t.Fatal("the prechecked read did not run under the scope's context")
	}
	if _, err := m.ReadAt(p[:integrity.BlockBytes], 3*integrity.BlockBytes); err == nil || len(told) != 1 {
		t.Fatalf("failed read: %v, told %v; want the error, told once", err, told)
	}
}
