package layers

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"warmstart/internal/integrity"
)

func TestPageMapRoundTrip(t *testing.T) {
	m := &PageMap{MemorySize: 64 * PageBytes, Data: []Run{{0, 3}, {10, 1}, {40, 24}}, Zero: []Run{{3, 2}, {11, 5}}}
	got, err := DecodePageMap(m.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), m.Encode()) || got.DataPages() != 28 || got.ZeroPages() != 7 {
		t.Fatalf("round trip: %+v", got)
	}
}

func TestPageMapRejects(t *testing.T) {
	for name, m := range map[string]*PageMap{
		"overlap data":      {MemorySize: 8 * PageBytes, Data: []Run{{0, 3}, {2, 1}}},
		"data and zero":     {MemorySize: 8 * PageBytes, Data: []Run{{0, 3}}, Zero: []Run{{2, 1}}},
		"outside":           {MemorySize: 8 * PageBytes, Data: []Run{{6, 3}}},
		"empty run":         {MemorySize: 8 * PageBytes, Zero: []Run{{1, 0}}},
		"unsorted":          {MemorySize: 8 * PageBytes, Data: []Run{{4, 1}, {1, 1}}},
		"unaligned memory":  {MemorySize: 8*PageBytes + 1},
		"negative first":    {MemorySize: 8 * PageBytes, Data: []Run{{-1, 2}}},
		"count overflowing": {MemorySize: 8 * PageBytes, Data: []Run{{1, 1<<63 - 1}}},
	} {
		if _, err := DecodePageMap(m.Encode()); !errors.Is(err, ErrBadPageMap) {
			t.Errorf("%s: decode = %v, want ErrBadPageMap", name, err)
		}
	}
	good := (&PageMap{MemorySize: 8 * PageBytes, Data: []Run{{0, 1}}}).Encode()
	for name, b := range map[string][]byte{"short": good[:20], "truncated run": good[:len(good)-1], "trailing": append(good, 0)} {
		if _, err := DecodePageMap(b); !errors.Is(err, ErrBadPageMap) {
			t.Errorf("%s: decode = %v, want ErrBadPageMap", name, err)
		}
	}
}

// model is a brute-force chain: per page, the bytes the chain serves.
type model [][]byte

func page(seed uint64) []byte {
	p := make([]byte, PageBytes)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// TestBuilderOverChain builds layers over a random base and checks that a
// chain of them resolves each page to the model's bytes, that identical
// pages are dropped and zero pages stored as zero runs.
func TestBuilderOverChain(t *testing.T) {
	const pages = 300
	rng := rand.New(rand.NewPCG(1, 2))
	base := make([]byte, pages*PageBytes)
	for p := range pages {
		copy(base[p*PageBytes:], page(uint64(p)))
	}
	want := model(make([][]byte, pages))
	for p := range pages {
		want[p] = base[p*PageBytes : (p+1)*PageBytes]
	}
	maps, datas := []*PageMap{nil}, [][]byte{base}
	tables := []*integrity.Table{tableOf(base)}
	for depth := 1; depth <= 5; depth++ {
		c, err := NewChain(pages*PageBytes, maps)
		if err != nil {
			t.Fatal(err)
		}
		parent, err := ChainDigests(c, tables)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		b, err := NewBuilder(dir, pages*PageBytes, parent)
		if err != nil {
			t.Fatal(err)
		}
		var identical, zero int64
		for p := int64(0); p < pages; p++ {
			switch rng.IntN(6) {
			case 0:
				data := page(uint64(depth*1000) + uint64(p))
				must(t, b.Add(p, data))
				want[p] = data
			case 1:
				must(t, b.Add(p, make([]byte, PageBytes)))
				if !bytes.Equal(want[p], make([]byte, PageBytes)) {
					zero++
				} else {
					identical++
				}
				want[p] = make([]byte, PageBytes)
			case 2:
				must(t, b.Add(p, bytes.Clone(want[p])))
				identical++
			}
		}
		built, err := b.Finish()
		if err != nil {
			t.Fatal(err)
		}
		if built.Counts.Identical != identical || built.Counts.Zero != zero {
			t.Fatalf("depth %d: counts %+v, want identical %d zero %d", depth, built.Counts, identical, zero)
		}
		data, err := os.ReadFile(built.Path(DataFileName))
		must(t, err)
		sum := sha256.Sum256(data)
		if int64(len(data)) != built.Size || built.Size != built.Counts.Stored*PageBytes || built.Name() != LayerName(hexOf(sum[:])) {
			t.Fatalf("depth %d: data %d bytes, built %+v", depth, len(data), built)
		}
		maps, datas, tables = append(maps, built.Map), append(datas, data), append(tables, tableOf(data))
		checkChain(t, maps, datas, want)
	}
}

func checkChain(t *testing.T, maps []*PageMap, datas [][]byte, want model) {
	t.Helper()
	c, err := NewChain(int64(len(want))*PageBytes, maps)
	must(t, err)
	for p := range int64(len(want)) {
		layer, slot, zero := c.Locate(p)
		got := make([]byte, PageBytes)
		if !zero {
			got = datas[layer][slot*PageBytes : (slot+1)*PageBytes]
		}
		if !bytes.Equal(got, want[p]) {
			t.Fatalf("depth %d page %d: layer %d slot %d zero %v serves other bytes", c.Depth(), p, layer, slot, zero)
		}
	}
}

func tableOf(data []byte) *integrity.Table {
	b := integrity.NewBuilder(integrity.SHA256, int64(len(data)))
	b.Write(data)
	return b.Table()
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return b
}
