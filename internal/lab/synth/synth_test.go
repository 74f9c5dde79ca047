package synth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/trace"
)

func TestModelShape(t *testing.T) {
	const mib = 1 << 20
	for _, seed := range []uint64{1, 2, 3} {
		m, err := NewModel(128*mib, seed)
		if err != nil {
			t.Fatal(err)
		}
		s := m.Stats()
		touched := int64(s.TouchedPages) * trace.PageBytes
		zeroFrac := float64(s.ZeroPages) / float64(m.Pages())
		writeFrac := float64(s.Writes) / float64(len(m.Trace))
		switch {
		case touched < 35*mib || touched > 45*mib:
			t.Errorf("seed %d: %d MiB touched, want 35-45 MiB", seed, touched/mib)
		case zeroFrac < 0.40 || zeroFrac > 0.50:
			t.Errorf("seed %d: %.2f of pages zero, want 0.40-0.50", seed, zeroFrac)
		case writeFrac < 0.10 || writeFrac > 0.20:
			t.Errorf("seed %d: %.2f of touches write, want 0.10-0.20", seed, writeFrac)
		case s.Compute < 30*time.Millisecond || s.Compute > 60*time.Millisecond:
			t.Errorf("seed %d: %v compute, want 30-60 ms", seed, s.Compute)
		case s.TouchedZeroPages == 0:
			t.Errorf("seed %d: no zero page is touched", seed)
		case s.TouchedPages != len(m.Trace):
			t.Errorf("seed %d: %d entries for %d pages: a page is touched twice", seed, len(m.Trace), s.TouchedPages)
		}
		if err := trace.Validate(m.Trace, m.Layout); err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
}

// TestModelClustered checks that the trace is mostly runs of neighbouring
// pages, yet jumps between clusters many times.
func TestModelClustered(t *testing.T) {
	m, err := NewModel(128<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	sequential, jumps := 0, 0
	for i := 1; i < len(m.Trace); i++ {
		d := m.Trace[i].Offset - m.Trace[i-1].Offset
		if d == trace.PageBytes {
			sequential++
		} else if d < -1<<20 || d > 1<<20 {
			jumps++
		}
	}
	if f := float64(sequential) / float64(len(m.Trace)); f < 0.4 {
		t.Errorf("%.2f of touches follow their predecessor's page, want a clustered trace (>= 0.4)", f)
	}
	if jumps < len(m.Trace)/20 {
		t.Errorf("%d jumps of over 1 MiB in %d touches, want interleaved clusters", jumps, len(m.Trace))
	}
}

func TestNewModelRejectsSizes(t *testing.T) {
	for _, size := range []int64{0, MinMemoryBytes - trace.PageBytes, MinMemoryBytes + 1, MaxMemoryBytes + trace.PageBytes} {
		if _, err := NewModel(size, 1); err == nil {
			t.Errorf("NewModel(%d) accepted", size)
		}
	}
}

func hashFiles(t *testing.T, p Paths) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	for _, path := range []string{p.Memory, p.VMState, p.Layout, p.Trace} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out[path[len(p.Dir):]] = sha256.Sum256(b)
	}
	return out
}

func TestGenerateDeterministic(t *testing.T) {
	gen := func(seed uint64) map[string][32]byte {
		p, err := Generate(context.Background(), Options{MemoryBytes: 16 << 20, Seed: seed, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return hashFiles(t, p)
	}
	a, b, c := gen(7), gen(7), gen(8)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 gave different files: %x vs %x", a, b)
	}
	for _, name := range []string{"/" + MemoryFile, "/" + TraceFile} {
		if a[name] == c[name] {
			t.Errorf("%s is the same for seeds 7 and 8", name)
		}
	}
}

func TestGenerateMatchesModel(t *testing.T) {
	const size = 16 << 20
	var progress bytes.Buffer
	dir := t.TempDir()
	p, err := Generate(context.Background(), Options{MemoryBytes: size, Seed: 3, Dir: dir, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if p != PathsIn(dir) {
		t.Fatalf("paths %+v, want %+v", p, PathsIn(dir))
	}
	m, err := NewModel(size, 3)
	if err != nil {
		t.Fatal(err)
	}

	f, err := os.Open(p.Memory)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page, want := make([]byte, trace.PageBytes), make([]byte, trace.PageBytes)
	zero := make([]byte, trace.PageBytes)
	for i := range m.Pages() {
		if _, err := io.ReadFull(f, page); err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		m.FillPage(i, want)
		if !bytes.Equal(page, want) {
			t.Fatalf("page %d differs from the model", i)
		}
		if bytes.Equal(page, zero) != m.PageIsZero(i) {
			t.Fatalf("page %d: zero %v, model says %v", i, bytes.Equal(page, zero), m.PageIsZero(i))
		}
	}
	if n, _ := f.Read(page); n != 0 {
		t.Fatalf("memory file longer than %d bytes", size)
	}

	spec, err := os.ReadFile(p.Layout)
	if err != nil {
		t.Fatal(err)
	}
	l, err := layout.Parse(string(spec), size)
	if err != nil || !l.Equal(layout.Single(size)) {
		t.Fatalf("layout file %q: %v, %v", spec, l, err)
	}
	state, err := os.ReadFile(p.VMState)
	if err != nil || !strings.HasPrefix(string(state), VMStateMagic+"\n") {
		t.Fatalf("vm state %q: %v", state, err)
	}
	entries, err := trace.ReadFile(p.Trace)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(entries, m.Trace) {
		t.Fatal("trace file differs from the model's trace")
	}
	if !strings.Contains(progress.String(), "zero pages") {
		t.Errorf("no summary in progress output:\n%s", progress.String())
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 4 {
		t.Errorf("directory holds %d entries, want the 4 files", len(left))
	}
}
