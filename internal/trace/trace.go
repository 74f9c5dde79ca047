// Package trace reads and writes startup traces: the ordered page touches a
// guest makes while it resumes from a snapshot until its agent is ready.
// The replay VMM plays a trace back against mapped snapshot memory, and the
// reference snapshot generator writes one next to its memory file.
//
// A trace file is UTF-8 text, one touch per line:
//
//	warmstart-trace 1
//	# comments and blank lines are ignored
//	<offset> <r|w> <compute_ns>
//
// The first non-comment line is the header naming the format and version.
// offset is the touched page's logical offset (its byte offset in the memory
// file), a multiple of PageBytes. r marks a read touch and w a write touch.
// compute_ns is the guest execution time, in nanoseconds, that passes before
// the touch. Numbers are decimal. Text keeps traces diffable and greppable;
// a 40 MiB startup set is about 10,000 lines, which parse in milliseconds.
package trace

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"warmstart/internal/durable"
	"warmstart/internal/layout"
	"warmstart/internal/untrusted"
)

// PageBytes is the size of one traced page: the host base page. A touch of
// a page inside a huge-page region still names its 4 KiB page.
const PageBytes = 4096

// Header is the first line of every trace file.
const Header = "warmstart-trace 1"

// maxLineBytes bounds one line so that a corrupt file cannot make Read
// buffer without limit.
const maxLineBytes = 4096

// ErrMalformed is wrapped by every error that rejects a trace's content.
var ErrMalformed = errors.New("malformed startup trace")

// Entry is one page touch.
type Entry struct {
	// Offset is the page's logical offset, a multiple of PageBytes.
	Offset int64
	// Write marks a touch that writes the page; otherwise it is read.
	Write bool
	// Compute is the guest execution time that passes before this touch.
	Compute time.Duration
}

// check reports why e cannot be part of a trace.
func (e Entry) check() error {
	switch {
	case e.Offset < 0:
		return fmt.Errorf("offset %d is negative", e.Offset)
	case e.Offset%PageBytes != 0:
		return fmt.Errorf("offset %d is not a multiple of %d", e.Offset, PageBytes)
	case e.Compute < 0:
		return fmt.Errorf("compute time %d ns is negative", int64(e.Compute))
	}
	return nil
}

// Write writes entries in the trace format. It refuses entries that Read
// would reject, so that every written trace reads back.
func Write(w io.Writer, entries []Entry) error {
	bw := bufio.NewWriter(w)
	if _, err := fmt.Fprintf(bw, "%s\n# offset access compute_ns\n", Header); err != nil {
		return fmt.Errorf("write trace header: %w", err)
	}
	var line []byte
	for i, e := range entries {
		if err := e.check(); err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrMalformed, i, err)
		}
		access := byte('r')
		if e.Write {
			access = 'w'
		}
		line = strconv.AppendInt(line[:0], e.Offset, 10)
		line = append(line, ' ', access, ' ')
		line = strconv.AppendInt(line, int64(e.Compute), 10)
		line = append(line, '\n')
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("write trace entry %d: %w", i, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	return nil
}

// Read parses a trace. Errors on bad content wrap ErrMalformed and name the
// line; I/O errors are wrapped as they come.
func Read(r io.Reader) ([]Entry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), maxLineBytes)
	var entries []Entry
	sawHeader := false
	lineNo := 0
	for sc.Scan() {
		lineNo++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if !sawHeader {
			if text != Header {
				return nil, fmt.Errorf("%w: line %d: header %q, want %q", ErrMalformed, lineNo, text, Header)
			}
			sawHeader = true
			continue
		}
		e, err := parseEntry(text)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d %q: %v", ErrMalformed, lineNo, text, err)
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d longer than %d bytes", ErrMalformed, lineNo+1, maxLineBytes)
		}
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if !sawHeader {
		return nil, fmt.Errorf("%w: missing header %q", ErrMalformed, Header)
	}
	return entries, nil
}

func parseEntry(text string) (Entry, error) {
	fields := strings.Fields(text)
	if len(fields) != 3 {
		return Entry{}, fmt.Errorf("%d fields, want 3: offset access compute_ns", len(fields))
	}
	off, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return Entry{}, fmt.Errorf("offset: %v", err)
	}
	var e Entry
	e.Offset = off
	switch fields[1] {
	case "r":
	case "w":
		e.Write = true
	default:
		return Entry{}, fmt.Errorf("access %q, want r or w", fields[1])
	}
	ns, err := strconv.ParseInt(fields[2], 10, 64)
	if err != nil {
		return Entry{}, fmt.Errorf("compute_ns: %v", err)
	}
	e.Compute = time.Duration(ns)
	return e, e.check()
}

// ReadFile reads the trace at path.
func ReadFile(path string) ([]Entry, error) {
	// A FIFO or a device named as a trace would block open(2) or stream
	// for ever: only a regular file (or a symlink to one) is a trace.
	f, err := untrusted.OpenFollowing(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	entries, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return entries, nil
}

// WriteFile writes entries to path durably: a temporary file in the same
// directory is written, synced and renamed over path, and the directory is
// synced, so a crash leaves either the old trace or the new one.
func WriteFile(path string, entries []Entry) error {
	return durable.WriteFile(path, 0o600, func(w io.Writer) error { return Write(w, entries) })
}

// Validate checks that every touched page lies inside one region of l, so
// that playing the trace back cannot fault outside mapped memory.
func Validate(entries []Entry, l layout.Layout) error {
	for i, e := range entries {
		if err := e.check(); err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrMalformed, i, err)
		}
		if !l.Contains(e.Offset, PageBytes) {
			return fmt.Errorf("%w: entry %d: page at offset %d is outside the memory layout %s", ErrMalformed, i, e.Offset, l)
		}
	}
	return nil
}

// Stats summarises a trace.
type Stats struct {
	// Entries is the number of touches.
	Entries int
	// Pages is the number of distinct pages touched.
	Pages int
	// Writes is the number of write touches.
	Writes int
	// Compute is the total compute time.
	Compute time.Duration
}

// Summarize computes the Stats of entries.
func Summarize(entries []Entry) Stats {
	seen := make(map[int64]struct{}, len(entries))
	s := Stats{Entries: len(entries)}
	for _, e := range entries {
		seen[e.Offset] = struct{}{}
		if e.Write {
			s.Writes++
		}
		s.Compute += e.Compute
	}
	s.Pages = len(seen)
	return s
}

// Difference is how one trace's touched pages differ from a base trace's.
type Difference struct {
	// BasePages and Pages are the distinct pages each trace touches.
	BasePages, Pages int
	// Dropped pages are touched by the base only, Added by the other only.
	Dropped, Added int
	// Fraction is half the symmetric difference over the base's pages:
	// for a trace that swaps some of the base's pages for others, the
	// share of the base's pages swapped.
	Fraction float64
	// RankCorrelation is Spearman's correlation of the first-touch ranks
	// of the pages both traces touch (1: same order; 0 with fewer than
	// two shared pages).
	RankCorrelation float64
}

// Compare measures how entries differ from base: which pages they touch,
// and in which order they first touch those both touch.
func Compare(base, entries []Entry) Difference {
	baseRank, rank := firstTouches(base), firstTouches(entries)
	d := Difference{BasePages: len(baseRank), Pages: len(rank)}
	var shared []int64 // in the base's order
	for i, e := range base {
		if baseRank[e.Offset] != i {
			continue // not the page's first touch
		}
		if _, ok := rank[e.Offset]; ok {
			shared = append(shared, e.Offset)
		} else {
			d.Dropped++
		}
	}
	d.Added = d.Pages - len(shared)
	if d.BasePages > 0 {
		d.Fraction = float64(d.Dropped+d.Added) / float64(2*d.BasePages)
	}
	d.RankCorrelation = spearman(shared, rank)
	return d
}

// firstTouches maps each page to the index of its first touch.
func firstTouches(entries []Entry) map[int64]int {
	m := make(map[int64]int, len(entries))
	for i, e := range entries {
		if _, ok := m[e.Offset]; !ok {
			m[e.Offset] = i
		}
	}
	return m
}

// spearman is the rank correlation of shared, listed in the base's order,
// with their order in rank.
func spearman(shared []int64, rank map[int64]int) float64 {
	n := len(shared)
	if n < 2 {
		return 0
	}
	byOther := slices.Clone(shared)
	slices.SortFunc(byOther, func(a, b int64) int { return cmp.Compare(rank[a], rank[b]) })
	other := make(map[int64]int, n)
	for i, off := range byOther {
		other[off] = i
	}
	var sum float64
	for i, off := range shared {
		d := float64(i - other[off])
		sum += d * d
	}
	nf := float64(n)
	return 1 - 6*sum/(nf*(nf*nf-1))
}
