package integrity

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
)

func randomFile(_ testing.TB, size int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func tableOf(data []byte) *Table { return tableOfAlg(CRC32C, data) }

func tableOfAlg(alg Algorithm, data []byte) *Table {
	b := NewBuilder(alg, int64(len(data)))
	b.Write(data)
	return b.Table()
}

func TestBuilderIsIndependentOfWriteSizes(t *testing.T) {
	data := randomFile(t, 5*BlockBytes+123, 1)
	want := tableOf(data)
	rng := rand.New(rand.NewPCG(2, 2))
	for trial := 0; trial < 20; trial++ {
		b := NewBuilder(CRC32C, 0)
		for rest := data; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(3*BlockBytes))
			b.Write(rest[:k])
			rest = rest[k:]
		}
		if got := b.Table(); !bytes.Equal(got.Encode(), want.Encode()) {
			t.Fatalf("trial %d: table differs from one built in a single write", trial)
		}
	}
	if want.Blocks() != 6 || want.FileSize() != int64(len(data)) {
		t.Fatalf("table has %d blocks for %d bytes", want.Blocks(), want.FileSize())
	}
}

func TestEncodeDecodeRoundTripAndRejections(t *testing.T) {
	for _, alg := range []Algorithm{SHA256, CRC32C} {
		t.Run(string(alg), func(t *testing.T) { testEncodeDecode(t, alg) })
	}
}

func testEncodeDecode(t *testing.T, alg Algorithm) {
	data := randomFile(t, 3*BlockBytes+7, 3)
	tab := tableOfAlg(alg, data)
	enc := tab.Encode()
	if int64(len(enc)) != EncodedSize(alg, int64(len(data))) {
		t.Fatalf("encoded %d bytes, EncodedSize says %d", len(enc), EncodedSize(alg, int64(len(data))))
	}
	if a, ok := AlgorithmOf(enc); !ok || a != alg {
		t.Fatalf("AlgorithmOf = %q, %v; want %q", a, ok, alg)
	}
	got, err := Decode(enc, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Algorithm() != alg || len(got.Mismatches(tab)) != 0 {
		t.Fatal("decoded table differs")
	}
	if _, err := Decode(enc, int64(len(data))+1); !errors.Is(err, ErrSizeChanged) {
		t.Errorf("other file size: %v, want ErrSizeChanged", err)
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"magic":     func(b []byte) []byte { b[0] = 'X'; return b },
		"version":   func(b []byte) []byte { b[4] = 9; return b },
		"algorithm": func(b []byte) []byte { b[6] = 9; return b },
		"blocksize": func(b []byte) []byte { b[9] = 0x20; return b },
		"truncated": func(b []byte) []byte { return b[:len(b)-1] },
		"appended":  func(b []byte) []byte { return append(b, 0) },
		"empty":     func([]byte) []byte { return nil },
	} {
		b := mutate(append([]byte(nil), enc...))
		if _, err := Decode(b, int64(len(data))); !errors.Is(err, ErrBadTable) {
			t.Errorf("%s: %v, want ErrBadTable", name, err)
		}
	}
}

func TestReaderServesOnlyVerifiedBytes(t *testing.T) {
	for _, alg := range []Algorithm{SHA256, CRC32C} {
		t.Run(string(alg), func(t *testing.T) { testReaderServesOnlyVerifiedBytes(t, alg) })
	}
}

func testReaderServesOnlyVerifiedBytes(t *testing.T, alg Algorithm) {
	good := randomFile(t, 8*BlockBytes+100, 4)
	tab := tableOfAlg(alg, good)
	bad := append([]byte(nil), good...)
	bad[3*BlockBytes+17] ^= 0x40 // block 3 is corrupt
	var reports atomic.Int32
	var reportedAt atomic.Int64
	r := NewReader(bytes.NewReader(bad), tab, func(e *BlockError) {
		reports.Add(1)
		reportedAt.Store(e.Offset)
	})

	cases := []struct {
		name     string
		off, len int
		wantN    int
		corrupt  bool
	}{
		{"clean aligned", 0, 3 * BlockBytes, 3 * BlockBytes, false},
		{"clean unaligned", 100, 2*BlockBytes + 50, 2*BlockBytes + 50, false},
		{"aligned over bad block", 2 * BlockBytes, 3 * BlockBytes, BlockBytes, true},
		{"unaligned over bad block", 2*BlockBytes + 10, 2 * BlockBytes, BlockBytes - 10, true},
		{"inside bad block", 3*BlockBytes + 100, 10, 0, true},
		{"after bad block", 4 * BlockBytes, 4*BlockBytes + 100, 4*BlockBytes + 100, false},
	}
	for _, c := range cases {
		p := bytes.Repeat([]byte{0xAA}, c.len)
		n, err := r.ReadAt(p, int64(c.off))
		if n != c.wantN {
			t.Errorf("%s: n = %d, want %d", c.name, n, c.wantN)
		}
		if c.corrupt != errors.Is(err, ErrCorrupt) || (!c.corrupt && err != nil && !errors.Is(err, io.EOF)) {
			t.Errorf("%s: err = %v", c.name, err)
		}
		if !bytes.Equal(p[:n], good[c.off:c.off+n]) {
			t.Errorf("%s: returned bytes differ from the file's", c.name)
		}
		if !bytes.Equal(p[n:], make([]byte, len(p)-n)) {
			t.Errorf("%s: bytes after the verified prefix are not zeroed", c.name)
		}
	}
	if reports.Load() != 1 || reportedAt.Load() != 3*BlockBytes {
		t.Errorf("reported %d times at %d, want once at %d", reports.Load(), reportedAt.Load(), 3*BlockBytes)
	}
	var be *BlockError
	_, err := r.ReadAt(make([]byte, BlockBytes), 3*BlockBytes)
	if !errors.As(err, &be) || be.Offset != 3*BlockBytes {
		t.Errorf("error %v does not name the block at %d", err, 3*BlockBytes)
	}
}

func TestReaderRefusesAnotherFileOfTheSameSize(t *testing.T) {
	a := randomFile(t, 16*BlockBytes, 5)
	b := randomFile(t, 16*BlockBytes, 6)
	r := NewReader(bytes.NewReader(b), tableOf(a), nil)
	if n, err := r.ReadAt(make([]byte, len(a)), 0); n != 0 || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a swapped file: n=%d err=%v", n, err)
	}
	if len(tableOf(a).Mismatches(tableOf(b))) != 16 {
		t.Fatal("Mismatches does not list every differing block")
	}
}

func TestReaderReportsAShrunkFileAndEOF(t *testing.T) {
	data := randomFile(t, 4*BlockBytes+10, 7)
	tab := tableOf(data)
	r := NewReader(bytes.NewReader(data[:2*BlockBytes+5]), tab, nil)
	n, err := r.ReadAt(make([]byte, 4*BlockBytes), 0)
	if n != 2*BlockBytes || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short file: n=%d err=%v, want %d and ErrUnexpectedEOF", n, err, 2*BlockBytes)
	}
	full := NewReader(bytes.NewReader(data), tab, nil)
	p := make([]byte, BlockBytes)
	n, err = full.ReadAt(p, 4*BlockBytes)
	if n != 10 || !errors.Is(err, io.EOF) || !bytes.Equal(p[:10], data[4*BlockBytes:]) {
		t.Fatalf("read across the end: n=%d err=%v", n, err)
	}
	if _, err := full.ReadAt(p, int64(len(data))); !errors.Is(err, io.EOF) {
		t.Fatalf("read at the end: %v", err)
	}
}

func BenchmarkReaderAligned(b *testing.B) {
	for _, alg := range []Algorithm{SHA256, CRC32C} {
		b.Run(string(alg), func(b *testing.B) {
			data := make([]byte, 1<<20)
			for i := range data {
				data[i] = byte(i * 31)
			}
			r := NewReader(bytes.NewReader(data), tableOfAlg(alg, data), nil)
			p := make([]byte, 128<<10)
			b.SetBytes(int64(len(p)))
			for i := 0; b.Loop(); i++ {
				r.ReadAt(p, int64(i%8)*int64(len(p)))
			}
		})
	}
}

// BenchmarkBlockDigest is the cost of one block's digest, what a device
// pays per page it serves.
func BenchmarkBlockDigest(b *testing.B) {
	block := randomFile(nil, BlockBytes, 10)
	for _, alg := range []Algorithm{SHA256, CRC32C} {
		b.Run(string(alg), func(b *testing.B) {
			dst := make([]byte, alg.digestBytes())
			b.SetBytes(BlockBytes)
			for b.Loop() {
				alg.digest(dst, block)
			}
		})
	}
}

// copyKeeper serves a kept copy of origin until Uncache replaces a range
// of the copy with origin's bytes: a node cache in front of a store.
type copyKeeper struct {
	origin, copy      []byte
	uncached, refused [][2]int64
}

func (k *copyKeeper) ReadAt(p []byte, off int64) (int, error) {
	return copy(p, k.copy[off:]), nil
}

func (k *copyKeeper) Refuse(off, length int64) {
	k.refused = append(k.refused, [2]int64{off, length})
}

func (k *copyKeeper) Uncache(off, length int64) {
	k.uncached = append(k.uncached, [2]int64{off, length})
	copy(k.copy[off:off+length], k.origin[off:off+length])
}

// TestReaderFetchesAgainWhatAKeptCopyDamaged: a bad block from a source
// that keeps a copy is dropped from the copy and read once more; good
// bytes from the origin are served and nothing is reported. A block still
// bad from the origin is reported once and refused, so that no copy keeps
// it and reads of it fail at once for a while.
func TestReaderFetchesAgainWhatAKeptCopyDamaged(t *testing.T) {
	good := randomFile(t, 4*BlockBytes, 9)
	damaged := append([]byte(nil), good...)
	damaged[2*BlockBytes+5] ^= 1
	for _, originBad := range []bool{false, true} {
		origin := good
		if originBad {
			origin = damaged
		}
		src := &copyKeeper{origin: origin, copy: append([]byte(nil), damaged...)}
		var reports atomic.Int32
		r := NewReader(src, tableOf(good), func(*BlockError) { reports.Add(1) })
		p := make([]byte, 4*BlockBytes)
		n, err := r.ReadAt(p, 0)
		wantUncached := [][2]int64{{2 * BlockBytes, 2 * BlockBytes}}
		var wantRefused [][2]int64
		if originBad {
			wantRefused = [][2]int64{{2 * BlockBytes, BlockBytes}}
		}
		switch {
		case !originBad && (err != nil || n != len(p) || !bytes.Equal(p, good) || reports.Load() != 0):
			t.Errorf("copy damaged, origin good: n %d, err %v, %d reports; want every byte, right, no report", n, err, reports.Load())
		case originBad && (!errors.Is(err, ErrCorrupt) || n != 2*BlockBytes || reports.Load() != 1):
			t.Errorf("origin damaged: n %d, err %v, %d reports; want the 2 good blocks, ErrCorrupt, one report", n, err, reports.Load())
		case !slices.Equal(src.uncached, wantUncached) || !slices.Equal(src.refused, wantRefused):
			t.Errorf("origin damaged %v: uncached %v and refused %v, want %v and %v", originBad, src.uncached, src.refused, wantUncached, wantRefused)
		}
	}
}

// prechecker serves data and marks the blocks of marked as prechecked.
type prechecker struct {
	data   []byte
	marked map[int64]bool // block offsets
	table  *Table
}

func (p *prechecker) ReadAt(b []byte, off int64) (int, error) { return copy(b, p.data[off:]), nil }

func (p *prechecker) ReadAtPrechecked(b []byte, off int64, t *Table, checked []bool) (int, error) {
	if t.Equal(p.table) {
		for k := range checked {
			checked[k] = p.marked[off+int64(k)*BlockBytes]
		}
	}
	return p.ReadAt(b, off)
}

// TestReaderHashesOnlyWhatASourceDidNotPrecheck: a source that checked
// some blocks against the same table as they arrived (a Prechecker) gets
// them served without a second hash; every other block is hashed and
// checked as ever, so a bad block the source did not vouch for is still
// refused, and a source that checked against another table vouches for
// nothing.
func TestReaderHashesOnlyWhatASourceDidNotPrecheck(t *testing.T) {
	good := randomFile(t, 4*BlockBytes, 11)
	damaged := append([]byte(nil), good...)
	damaged[3*BlockBytes+1] ^= 1
	table := tableOfAlg(SHA256, good)
	other := tableOfAlg(SHA256, damaged)
	for _, tc := range []struct {
		name       string
		vouchedBy  *Table
		wantN      int
		wantHashed int64
	}{
		{"blocks 0 and 1 prechecked", table, 3 * BlockBytes, 2 * BlockBytes},
		{"checked against another table", other, 3 * BlockBytes, 4 * BlockBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &prechecker{data: damaged, marked: map[int64]bool{0: true, BlockBytes: true}, table: tc.vouchedBy}
			r := NewReader(src, table, nil)
			p := make([]byte, 4*BlockBytes)
			before := SHA256Hashed()
			n, err := r.ReadAt(p, 0)
			hashed := SHA256Hashed() - before
			if n != tc.wantN || !errors.Is(err, ErrCorrupt) || !bytes.Equal(p[:n], good[:n]) {
				t.Fatalf("read %d bytes, %v; want the %d before the bad block and ErrCorrupt", n, err, tc.wantN)
			}
			if hashed != tc.wantHashed {
				t.Fatalf("hashed %d bytes, want %d", hashed, tc.wantHashed)
			}
		})
	}
	if !table.Equal(tableOfAlg(SHA256, good)) || table.Equal(other) || table.Equal(tableOfAlg(CRC32C, good)) {
		t.Fatal("Equal does not tell tables by their digests")
	}
}
