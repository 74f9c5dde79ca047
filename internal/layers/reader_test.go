package layers

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// countingReader counts the reads of one layer.
type countingReader struct {
	data  []byte
	reads atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	if off >= int64(len(c.data)) {
		return 0, io.EOF
	}
	n := copy(p, c.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// randomChain makes a chain of depth layers over pages pages with random
// data and zero runs, and the model of the memory it serves.
func randomChain(rng *rand.Rand, pages int64, depth int) ([]*PageMap, [][]byte, []byte) {
	memory := make([]byte, pages*PageBytes)
	for i := range memory {
		memory[i] = byte(rng.Uint32())
	}
	maps, datas := []*PageMap{nil}, [][]byte{bytes.Clone(memory)}
	for range depth {
		m := &PageMap{MemorySize: pages * PageBytes}
		var data []byte
		for p := int64(0); p < pages; p++ {
			switch rng.IntN(5) {
			case 0:
				m.Data = appendPage(m.Data, p)
				pg := make([]byte, PageBytes)
				for i := range pg {
					pg[i] = byte(rng.Uint32())
				}
				data = append(data, pg...)
				copy(memory[p*PageBytes:], pg)
			case 1:
				m.Zero = appendPage(m.Zero, p)
				clear(memory[p*PageBytes : (p+1)*PageBytes])
			}
		}
		maps, datas = append(maps, m), append(datas, data)
	}
	return maps, datas, memory
}

func TestReaderMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 40 {
		pages := int64(1 + rng.IntN(200))
		depth := 1 + rng.IntN(16)
		maps, datas, memory := randomChain(rng, pages, depth)
		c, err := NewChain(pages*PageBytes, maps)
		must(t, err)
		readers := make([]io.ReaderAt, len(datas))
		counters := make([]*countingReader, len(datas))
		for i, d := range datas {
			counters[i] = &countingReader{data: d}
			readers[i] = counters[i]
		}
		r, err := NewReader(c, readers)
		must(t, err)
		for range 50 {
			off := rng.Int64N(pages * PageBytes)
			n := 1 + rng.IntN(200_000)
			got := make([]byte, n)
			before := make([]int64, len(counters))
			for i, cr := range counters {
				before[i] = cr.reads.Load()
			}
			k, err := r.ReadAt(got, off)
			want := memory[off:min(off+int64(n), int64(len(memory)))]
			if k != len(want) || (k < n) != errors.Is(err, io.EOF) || (k == n && err != nil) {
				t.Fatalf("trial %d: ReadAt(%d, %d) = %d, %v; want %d", trial, n, off, k, err, len(want))
			}
			if !bytes.Equal(got[:k], want) {
				t.Fatalf("trial %d depth %d: ReadAt(%d bytes at %d) differs from the model", trial, depth, n, off)
			}
			for i, cr := range counters {
				if d := cr.reads.Load() - before[i]; d > int64(countPieces(c, i, off, int64(k))) || (d > 1 && dense(c, i, off, int64(k))) {
					t.Fatalf("trial %d: layer %d read %d times for one call", trial, i, d)
				}
			}
		}
	}
}

// countPieces is how many pieces of [off, off+n) layer serves.
func countPieces(c *Chain, layer int, off, n int64) int {
	k := 0
	c.Pieces(off, n, func(p Piece) bool {
		if p.Layer == layer && !p.Zero {
			k++
		}
		return true
	})
	return k
}

// dense reports whether layer's pieces of the read fill at least half of
// their span (the reader then reads the layer once).
func dense(c *Chain, layer int, off, n int64) bool {
	var first, last, sum int64 = -1, 0, 0
	c.Pieces(off, n, func(p Piece) bool {
		if p.Layer == layer && !p.Zero {
			if first < 0 {
				first = p.LayerOff
			}
			last, sum = p.LayerOff+p.Len, sum+p.Len
		}
		return true
	})
	return first >= 0 && 2*sum >= last-first && last-first <= maxGather
}

func TestReaderNamesTheFailingLayer(t *testing.T) {
	maps := []*PageMap{nil, {MemorySize: 4 * PageBytes, Data: []Run{{2, 1}}}}
	c, err := NewChain(4*PageBytes, maps)
	must(t, err)
	r, err := NewReader(c, []io.ReaderAt{bytes.NewReader(make([]byte, 4*PageBytes)), bytes.NewReader(nil)})
	must(t, err)
	_, err = r.ReadAt(make([]byte, 4*PageBytes), 0)
	var le *LayerError
	if !errors.As(err, &le) || le.Layer != 1 || le.Logical != 2*PageBytes || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ReadAt over a truncated layer = %v, want a LayerError of layer 1 at %d", err, 2*PageBytes)
	}
}

func TestMergeEqualsTheChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const pages = 150
	maps, datas, memory := randomChain(rng, pages, 6)
	var srcs []Source
	for i := 1; i < len(maps); i++ {
		srcs = append(srcs, Source{Map: maps[i], Data: bytes.NewReader(datas[i]), SHA256: tableOf(datas[i])})
	}
	built, err := Merge(t.TempDir(), pages*PageBytes, srcs)
	must(t, err)
	c, err := NewChain(pages*PageBytes, []*PageMap{nil, built.Map})
	must(t, err)
	data := readFile(t, built.Path(DataFileName))
	r, err := NewReader(c, []io.ReaderAt{bytes.NewReader(datas[0]), bytes.NewReader(data)})
	must(t, err)
	got := make([]byte, pages*PageBytes)
	if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, memory) {
		t.Fatalf("merged chain serves other bytes (%v)", err)
	}
	if !bytes.Equal(readFile(t, built.Path(SHA256DigestsFileName)), tableOf(data).Encode()) {
		t.Fatal("merged SHA-256 table differs from one built over the merged data")
	}
}
