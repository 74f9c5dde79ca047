package chunkmap

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestMapRoundTrip(t *testing.T) {
	m := Map{ChunkBytes: 8192, Size: 8192*2 + 4096, Chunks: []Chunk{
		{Digest: Sum([]byte("a")), StoredBytes: 100}, {Zero: true}, {Digest: Sum([]byte("a")), StoredBytes: 100},
	}}
	got, err := Decode(m.Encode(), m.Size)
	if err != nil {
		t.Fatal(err)
	}
	if got.ChunkBytes != m.ChunkBytes || len(got.Chunks) != 3 || got.Chunks[0] != m.Chunks[0] || !got.Chunks[1].Zero {
		t.Fatalf("decoded %+v", got)
	}
	if got.StoredBytes() != 100 {
		t.Fatalf("stored bytes %d count a shared chunk twice", got.StoredBytes())
	}
	if got.Length(2) != 4096 {
		t.Fatalf("last chunk length %d", got.Length(2))
	}
}

func TestMapDecodeRefusesBadInput(t *testing.T) {
	good := Map{ChunkBytes: 4096, Size: 8192, Chunks: []Chunk{{Digest: Sum([]byte("x")), StoredBytes: 9}, {Zero: true}}}.Encode()
	cases := map[string]struct {
		data []byte
		size int64
		want string
	}{
		"truncated":    {good[:len(good)-1], 8192, "bytes, want"},
		"other size":   {good, 4096, "differs from the memory size"},
		"bad magic":    {append([]byte("XXXXXXXX"), good[8:]...), 8192, "magic"},
		"unknown kind": {func() []byte { b := bytes.Clone(good); b[28] = 7; return b }(), 8192, "kind 7"},
		"empty":        {nil, 8192, "magic"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(c.data, c.size)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestDecompressNeverReturnsOtherBytes(t *testing.T) {
	data := randomBytes(64<<10, 3)
	copy(data[1000:], make([]byte, 20000))
	stored := Compress(data)
	if got, err := Decompress(stored, len(data), Sum(data)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("round trip: %v", err)
	}
	flipped := bytes.Clone(stored)
	flipped[len(flipped)/2] ^= 0x40
	for name, s := range map[string][]byte{"flipped": flipped, "truncated": stored[:len(stored)-10], "empty": nil} {
		if _, err := Decompress(s, len(data), Sum(data)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := Decompress(stored, len(data), Sum([]byte("other"))); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("other digest: %v", err)
	}
}

func TestPackRoundTrip(t *testing.T) {
	logical := randomBytes(3*4096+100, 5)
	obj, idx := BuildPack(Sum([]byte("manifest")), logical, 4096)
	got, err := DecodePack(idx.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Frames) != 4 || got.StoredBytes() != int64(len(obj)) || got.ManifestSHA256 != Sum([]byte("manifest")) {
		t.Fatalf("decoded %+v (object %d bytes)", got, len(obj))
	}
	var out []byte
	for i, f := range got.Frames {
		data, err := Decompress(obj[f.Offset:f.Offset+f.StoredBytes], int(got.FrameLength(i)), f.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data...)
	}
	if !bytes.Equal(out, logical) {
		t.Fatal("frames do not unpack to the logical bytes")
	}
	if _, err := DecodePack(idx.Encode()[:50]); err == nil {
		t.Fatal("a truncated index decoded")
	}
}

// TestPackIndexV2: a self-describing index keeps its memory ranges in pack
// order; ranges that do not add up to the logical size, overlap or are not
// page aligned are refused; a format-1 index still decodes, without ranges.
func TestPackIndexV2(t *testing.T) {
	logical := randomBytes(3*4096, 6)
	ranges := []PackRange{{Offset: 8 * 4096, Length: 4096}, {Offset: 0, Length: 2 * 4096}}
	_, idx := BuildPack(Sum([]byte("m")), logical, 4096, ranges...)
	got, err := DecodePack(idx.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Ranges, ranges) || len(got.Frames) != 3 {
		t.Fatalf("decoded ranges %v, frames %d; want %v, 3", got.Ranges, len(got.Frames), ranges)
	}
	_, v1 := BuildPack(Sum([]byte("m")), logical, 4096)
	if got, err := DecodePack(v1.Encode()); err != nil || got.Ranges != nil {
		t.Fatalf("format 1: ranges %v, %v", got.Ranges, err)
	}
	for name, bad := range map[string][]PackRange{
		"short":     {{Offset: 0, Length: 2 * 4096}},
		"overlap":   {{Offset: 0, Length: 2 * 4096}, {Offset: 4096, Length: 4096}},
		"unaligned": {{Offset: 100, Length: 4096}, {Offset: 4096, Length: 2 * 4096}},
	} {
		_, idx := BuildPack(Sum([]byte("m")), logical, 4096, bad...)
		if _, err := DecodePack(idx.Encode()); err == nil {
			t.Errorf("%s ranges decoded", name)
		}
	}
	if _, err := DecodePack(idx.Encode()[:len(idx.Encode())-1]); err == nil {
		t.Fatal("a truncated format-2 index decoded")
	}
}

func TestIsZero(t *testing.T) {
	z := make([]byte, 10000)
	if !IsZero(z) {
		t.Fatal("zeros not zero")
	}
	z[9999] = 1
	if IsZero(z) {
		t.Fatal("a late non-zero byte missed")
	}
}

// TestStoredBytesBeyond: what a second map adds is its distinct non-zero
// chunks the first lacks, each counted once.
func TestStoredBytesBeyond(t *testing.T) {
	a, b, c, d := Sum([]byte("a")), Sum([]byte("b")), Sum([]byte("c")), Sum([]byte("d"))
	base := Map{ChunkBytes: 4096, Size: 4 * 4096, Chunks: []Chunk{{Digest: a, StoredBytes: 10}, {Zero: true}, {Digest: b, StoredBytes: 20}, {Digest: a, StoredBytes: 10}}}
	next := Map{ChunkBytes: 4096, Size: 5 * 4096, Chunks: []Chunk{
		{Digest: a, StoredBytes: 10}, {Digest: c, StoredBytes: 30}, {Zero: true}, {Digest: c, StoredBytes: 30}, {Digest: d, StoredBytes: 40}}}
	if got := next.StoredBytesBeyond(base); got != 70 {
		t.Errorf("next beyond base: %d bytes, want 70 (c once, d)", got)
	}
	if got := base.StoredBytesBeyond(base); got != 0 {
		t.Errorf("a map beyond itself: %d bytes, want 0", got)
	}
	if got, want := next.StoredBytesBeyond(Map{}), next.StoredBytes(); got != want {
		t.Errorf("beyond an empty map: %d bytes, want all %d", got, want)
	}
}

func TestListRoundTrip(t *testing.T) {
	a, b := Sum([]byte("a")), Sum([]byte("b"))
	got, err := DecodeList(EncodeList([]Digest{a, b, a}))
	if err != nil || !slices.Equal(got, []Digest{a, b, a}) {
		t.Fatalf("DecodeList = %v, %v", got, err)
	}
	if got, err := DecodeList(EncodeList(nil)); err != nil || len(got) != 0 {
		t.Fatalf("empty list: %v, %v", got, err)
	}
}

func TestReferencedReadsMapsAndLists(t *testing.T) {
	a, b := Sum([]byte("a")), Sum([]byte("b"))
	m := Map{ChunkBytes: 4096, Size: 3 * 4096, Chunks: []Chunk{{Digest: a, StoredBytes: 9}, {Zero: true}, {Digest: a, StoredBytes: 9}}}
	for name, c := range map[string]struct {
		data []byte
		want []Digest
	}{
		"map":  {m.Encode(), []Digest{a}},
		"list": {EncodeList([]Digest{b, a, b}), []Digest{b, a}},
	} {
		if got, err := Referenced(c.data); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: Referenced = %v, %v; want %v", name, got, err, c.want)
		}
	}
	list := EncodeList([]Digest{a, b})
	for name, data := range map[string][]byte{
		"truncated list": list[:len(list)-1],
		"long list":      append(bytes.Clone(list), 0),
		"truncated map":  m.Encode()[:40],
		"other magic":    append([]byte("WSPACK02"), list[8:]...),
		"empty":          nil,
	} {
		if got, err := Referenced(data); err == nil {
			t.Errorf("%s: Referenced = %v, want an error", name, got)
		}
	}
}
