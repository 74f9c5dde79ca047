package trace

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/untrusted"

	"golang.org/x/sys/unix"
)

func TestRoundTrip(t *testing.T) {
	entries := []Entry{
		{Offset: 0, Compute: 0},
		{Offset: 4096, Write: true, Compute: 1500},
		{Offset: 1 << 30, Compute: 3 * time.Millisecond},
		{Offset: 4096, Compute: 1},
	}
	var buf bytes.Buffer
	if err := Write(&buf, entries); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, entries) {
		t.Fatalf("round trip: got %+v, want %+v", got, entries)
	}
}

func TestRoundTripFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "startup.trace")
	entries := []Entry{{Offset: 8192, Write: true, Compute: 7}}
	if err := WriteFile(path, entries); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, entries) {
		t.Fatalf("got %+v, want %+v", got, entries)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

func TestEmptyTrace(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, nil); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&buf)
	if err != nil || len(got) != 0 {
		t.Fatalf("empty trace: got %v, %v", got, err)
	}
}

func TestReadRejectsMalformed(t *testing.T) {
	for name, text := range map[string]string{
		"empty":            "",
		"only comments":    "# nothing\n\n",
		"wrong header":     "warmstart-trace 2\n0 r 0\n",
		"entry before hdr": "0 r 0\nwarmstart-trace 1\n",
		"unaligned":        Header + "\n4097 r 0\n",
		"negative offset":  Header + "\n-4096 r 0\n",
		"bad access":       Header + "\n0 x 0\n",
		"negative compute": Header + "\n0 r -1\n",
		"too few fields":   Header + "\n0 r\n",
		"too many fields":  Header + "\n0 r 0 0\n",
		"not a number":     Header + "\nzero r 0\n",
		"offset overflow":  Header + "\n99999999999999999999 r 0\n",
		"compute overflow": Header + "\n0 r 99999999999999999999\n",
		"hex offset":       Header + "\n0x1000 r 0\n",
		"long line":        Header + "\n" + strings.Repeat("1", 5000) + " r 0\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Read(strings.NewReader(text))
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Read(%q) = %v, want ErrMalformed", text, err)
			}
		})
	}
}

func TestReadAcceptsCommentsAndSpace(t *testing.T) {
	text := "# made by hand\n\n" + Header + "\n  # a comment\n4096\tw\t10  \n\n"
	got, err := Read(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{{Offset: 4096, Write: true, Compute: 10}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestWriteRejectsInvalid(t *testing.T) {
	for _, e := range []Entry{{Offset: 1}, {Offset: -4096}, {Offset: 0, Compute: -1}} {
		if err := Write(&bytes.Buffer{}, []Entry{e}); !errors.Is(err, ErrMalformed) {
			t.Errorf("Write(%+v) = %v, want ErrMalformed", e, err)
		}
	}
}

func TestReadFileMissing(t *testing.T) {
	_, err := ReadFile(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want ErrNotExist", err)
	}
}

func TestValidate(t *testing.T) {
	l, err := layout.Parse("0:1MiB,2MiB:1MiB", 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		off int64
		ok  bool
	}{{0, true}, {1<<20 - 4096, true}, {1 << 20, false}, {2 << 20, true}, {3 << 20, false}, {-4096, false}} {
		err := Validate([]Entry{{Offset: tc.off}}, l)
		if (err == nil) != tc.ok {
			t.Errorf("offset %d: err %v, want ok=%v", tc.off, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Errorf("offset %d: %v does not wrap ErrMalformed", tc.off, err)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([]Entry{{Offset: 0, Compute: 5}, {Offset: 4096, Write: true, Compute: 7}, {Offset: 0, Write: true}})
	want := Stats{Entries: 3, Pages: 2, Writes: 2, Compute: 12}
	if s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
}

func pagesAt(pages ...int64) []Entry {
	out := make([]Entry, len(pages))
	for i, p := range pages {
		out[i] = Entry{Offset: p * PageBytes}
	}
	return out
}

func TestCompare(t *testing.T) {
	base := pagesAt(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, c := range []struct {
		name    string
		entries []Entry
		want    Difference
	}{
		{"same", pagesAt(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), Difference{BasePages: 10, Pages: 10, RankCorrelation: 1}},
		// Touching a page again changes nothing.
		{"again", pagesAt(1, 2, 3, 1, 4, 5, 6, 7, 8, 9, 10, 2), Difference{BasePages: 10, Pages: 10, RankCorrelation: 1}},
		{"reversed", pagesAt(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), Difference{BasePages: 10, Pages: 10, RankCorrelation: -1}},
		// Two of ten replaced: a fifth of the pages differ.
		{"replaced", pagesAt(1, 2, 11, 4, 5, 6, 7, 12, 9, 10), Difference{BasePages: 10, Pages: 10, Dropped: 2, Added: 2, Fraction: 0.2, RankCorrelation: 1}},
		{"dropped", pagesAt(1, 2, 3, 4, 5, 6, 7, 8), Difference{BasePages: 10, Pages: 8, Dropped: 2, Fraction: 0.1, RankCorrelation: 1}},
		{"disjoint", pagesAt(20, 21), Difference{BasePages: 10, Pages: 2, Dropped: 10, Added: 2, Fraction: 0.6}},
	} {
		got := Compare(base, c.entries)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// One neighbouring swap among ten: 1 - 6*2/(10*99).
	got := Compare(base, pagesAt(1, 2, 4, 3, 5, 6, 7, 8, 9, 10)).RankCorrelation
	if want := 1 - 12.0/990; got < want-1e-12 || got > want+1e-12 {
		t.Errorf("one swap: rank correlation %v, want %v", got, want)
	}
}

// TestReadFileRefusesWhatIsNotAFile: a FIFO named as a trace fails at once
// instead of blocking open(2) until a writer comes; a symlink to a trace
// is read as the trace.
func TestReadFileRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ReadFile(fifo)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, untrusted.ErrNotRegular) {
			t.Errorf("ReadFile(FIFO): %v; want %v", err, untrusted.ErrNotRegular)
		}
	case <-time.After(10 * time.Second):
		// Unblock the open so the goroutine ends with the test.
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("ReadFile(FIFO) still blocked after 10s")
	}

	real := filepath.Join(dir, "startup.trace")
	entries := []Entry{{Offset: 4096}}
	if err := WriteFile(real, entries); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.trace")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFile(link); err != nil || !reflect.DeepEqual(got, entries) {
		t.Fatalf("ReadFile(symlink to a trace) = %+v, %v; want %+v", got, err, entries)
	}
}
