package manifest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/untrusted"
)

const (
	page = 4096
	huge = 2 << 20
	mib  = 1 << 20
)

// twoRegions is a guest with 4 KiB pages in the first 8 MiB and 2 MiB huge
// pages in [16 MiB, 32 MiB), with a hole between them.
var twoRegions = layout.Layout{
	Regions: []layout.Region{
		{Offset: 0, Size: 8 * mib, PageSize: page},
		{Offset: 16 * mib, Size: 16 * mib, PageSize: huge},
	},
	FileSize: 32 * mib,
}

// sentinels are the errors a rejection must be told apart by.
var sentinels = []error{
	ErrTruncated, ErrTrailingData, ErrBadMagic, ErrUnsupportedVersion, ErrOverlap, ErrUnaligned,
	ErrOutsideLayout, ErrOversize, ErrDigestMismatch, ErrSizeMismatch, ErrLayoutMismatch, layout.ErrInvalid,
}

func region(offset, size, pageSize int64) layout.Region {
	return layout.Region{Offset: offset, Size: size, PageSize: pageSize}
}

// encodeRaw writes the format without validating, to build bad inputs.
func encodeRaw(version uint32, l layout.Layout, ranges []Range) []byte {
	le := binary.LittleEndian
	b := append([]byte{}, Magic[:]...)
	b = le.AppendUint32(b, version)
	b = le.AppendUint32(b, uint32(len(l.Regions)))
	b = le.AppendUint64(b, uint64(l.FileSize))
	for _, r := range l.Regions {
		b = le.AppendUint64(b, uint64(r.Offset))
		b = le.AppendUint64(b, uint64(r.Size))
		b = le.AppendUint64(b, uint64(r.PageSize))
	}
	b = le.AppendUint64(b, uint64(len(ranges)))
	for _, r := range ranges {
		b = le.AppendUint64(b, uint64(r.Offset))
		b = le.AppendUint64(b, uint64(r.Length))
	}
	return b
}

// wantOnly fails unless err is want and none of the other sentinels.
func wantOnly(t *testing.T, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", want)
	}
	for _, s := range sentinels {
		if is := errors.Is(err, s); is != (s == want) {
			t.Fatalf("error %q: errors.Is(%v) = %v", err, s, is)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for name, m := range map[string]*Manifest{
		"no ranges":    {Layout: layout.Single(64 * page)},
		"single":       {Layout: layout.Single(64 * page), Ranges: []Range{{Offset: 8 * page, Length: 2 * page}, {0, page}, {63 * page, page}}},
		"whole file":   {Layout: layout.Single(64 * page), Ranges: []Range{{0, 64 * page}}},
		"two regions":  {Layout: twoRegions, Ranges: []Range{{20 * mib, huge}, {4 * mib, 4 * mib}, {16 * mib, huge}, {0, page}}},
		"region edges": {Layout: twoRegions, Ranges: []Range{{8*mib - page, page}, {30 * mib, huge}}},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := Encode(m)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if want := headerBytes + len(m.Layout.Regions)*regionBytes + rangeCountBytes + len(m.Ranges)*rangeBytes; len(data) != want {
				t.Fatalf("encoded %d bytes, want %d", len(data), want)
			}
			got, err := Decode(data)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !got.Layout.Equal(m.Layout) || len(got.Ranges) != len(m.Ranges) ||
				len(m.Ranges) > 0 && !reflect.DeepEqual(got.Ranges, m.Ranges) {
				t.Fatalf("Decode(Encode(m)) = %+v, want %+v", got, m)
			}
			if got.TotalBytes() != m.TotalBytes() {
				t.Fatalf("TotalBytes %d, want %d", got.TotalBytes(), m.TotalBytes())
			}
			again, err := Encode(got)
			if err != nil || !bytes.Equal(again, data) {
				t.Fatalf("re-encoding differs (err %v)", err)
			}
		})
	}
}

func TestEncodingIsLittleEndianAndVersioned(t *testing.T) {
	data, err := Encode(&Manifest{Layout: layout.Single(2 * page), Ranges: []Range{{page, page}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("WSMANIF\x00" +
		"\x01\x00\x00\x00" + "\x01\x00\x00\x00" + "\x00\x20\x00\x00\x00\x00\x00\x00" + // version, regions, file size
		"\x00\x00\x00\x00\x00\x00\x00\x00" + "\x00\x20\x00\x00\x00\x00\x00\x00" + "\x00\x10\x00\x00\x00\x00\x00\x00" + // region
		"\x01\x00\x00\x00\x00\x00\x00\x00" + // range count
		"\x00\x10\x00\x00\x00\x00\x00\x00" + "\x00\x10\x00\x00\x00\x00\x00\x00") // range
	if !bytes.Equal(data, want) {
		t.Fatalf("encoding\n%x\nwant\n%x", data, want)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := layout.Single(64 * page)
	valid := encodeRaw(Version, good, []Range{{0, page}, {4 * page, 4 * page}})
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"part of magic", Magic[:5], ErrTruncated},
		{"magic only", Magic[:], ErrTruncated},
		{"header cut", valid[:headerBytes-1], ErrTruncated},
		{"regions cut", valid[:headerBytes+regionBytes-1], ErrTruncated},
		{"no range count", valid[:headerBytes+regionBytes], ErrTruncated},
		{"last range cut", valid[:len(valid)-1], ErrTruncated},
		{"huge region count", func() []byte {
			b := bytes.Clone(valid)
			binary.LittleEndian.PutUint32(b[12:], 0xffffffff)
			return b
		}(), ErrTruncated},
		{"huge range count", func() []byte {
			b := bytes.Clone(valid)
			binary.LittleEndian.PutUint64(b[headerBytes+regionBytes:], 1<<62)
			return b
		}(), ErrTruncated},
		{"trailing byte", append(bytes.Clone(valid), 0), ErrTrailingData},
		{"trailing range", append(bytes.Clone(valid), make([]byte, rangeBytes)...), ErrTrailingData},
		{"bad magic", append([]byte("WSMANIF\x01"), valid[8:]...), ErrBadMagic},
		{"short garbage", []byte("PK\x03"), ErrBadMagic},
		{"json", []byte(`{"ranges":[]}`), ErrBadMagic},
		{"version 0", encodeRaw(0, good, nil), ErrUnsupportedVersion},
		{"version 2", encodeRaw(2, good, nil), ErrUnsupportedVersion},
		{"overlap, later range first", encodeRaw(Version, good, []Range{{4 * page, 4 * page}, {2 * page, 3 * page}}), ErrOverlap},
		{"overlap, duplicate", encodeRaw(Version, good, []Range{{page, page}, {9 * page, page}, {page, page}}), ErrOverlap},
		{"overlap, contained", encodeRaw(Version, good, []Range{{0, 16 * page}, {8 * page, page}}), ErrOverlap},
		{"unaligned offset", encodeRaw(Version, good, []Range{{100, page}}), ErrUnaligned},
		{"unaligned length", encodeRaw(Version, good, []Range{{0, page + 1}}), ErrUnaligned},
		{"huge page region, 4 KiB range", encodeRaw(Version, twoRegions, []Range{{16 * mib, page}}), ErrUnaligned},
		{"past the file", encodeRaw(Version, good, []Range{{64 * page, page}}), ErrOutsideLayout},
		{"runs past the region", encodeRaw(Version, good, []Range{{60 * page, 8 * page}}), ErrOutsideLayout},
		{"in the hole between regions", encodeRaw(Version, twoRegions, []Range{{12 * mib, page}}), ErrOutsideLayout},
		{"across two regions", encodeRaw(Version, twoRegions, []Range{{0, 16*mib + huge}}), ErrOutsideLayout},
		{"zero length", encodeRaw(Version, good, []Range{{0, 0}}), ErrOutsideLayout},
		{"offset above int64", encodeRaw(Version, good, []Range{{-page, page}}), ErrOutsideLayout},
		{"length wraps the offset", encodeRaw(Version, good, []Range{{page, -page}}), ErrOutsideLayout},
		{"over 16 MiB", append(encodeRaw(Version, good, nil), make([]byte, MaxEncodedBytes)...), ErrOversize},
		{"no regions", encodeRaw(Version, layout.Layout{FileSize: page}, nil), layout.ErrInvalid},
		{"region past the file", encodeRaw(Version, layout.Layout{FileSize: page, Regions: []layout.Region{region(0, 2*page, page)}}, nil), layout.ErrInvalid},
		{"page size zero", encodeRaw(Version, layout.Layout{FileSize: page, Regions: []layout.Region{region(0, page, 0)}}, []Range{{0, page}}), layout.ErrInvalid},
		{"file size above int64", encodeRaw(Version, layout.Layout{FileSize: -1, Regions: []layout.Region{region(0, page, page)}}, nil), layout.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(tc.data)
			if m != nil {
				t.Errorf("Decode returned a manifest with error %v", err)
			}
			wantOnly(t, err, tc.want)
		})
	}
}

func TestEncodeValidates(t *testing.T) {
	l := layout.Single(16 * page)
	for _, tc := range []struct {
		name string
		m    *Manifest
		want error
	}{
		{"overlap", &Manifest{Layout: l, Ranges: []Range{{0, 2 * page}, {page, page}}}, ErrOverlap},
		{"unaligned", &Manifest{Layout: l, Ranges: []Range{{page / 2, page}}}, ErrUnaligned},
		{"outside", &Manifest{Layout: l, Ranges: []Range{{16 * page, page}}}, ErrOutsideLayout},
		{"bad layout", &Manifest{Layout: layout.Layout{}, Ranges: nil}, layout.ErrInvalid},
		{"too many ranges", &Manifest{Layout: l, Ranges: make([]Range, MaxEncodedBytes/rangeBytes)}, ErrOversize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := Encode(tc.m)
			if data != nil {
				t.Errorf("Encode returned %d bytes with error %v", len(data), err)
			}
			wantOnly(t, err, tc.want)
		})
	}
}

func TestOverlapErrorNamesBothRanges(t *testing.T) {
	ranges := []Range{{0, page}, {8 * page, page}, {2 * page, page}, {8 * page, 2 * page}}
	_, err := Encode(&Manifest{Layout: layout.Single(16 * page), Ranges: ranges})
	if !errors.Is(err, ErrOverlap) || !strings.Contains(err.Error(), "range 1 [32768, 36864) and range 3 [32768, 40960)") {
		t.Fatalf("error %v does not name ranges 1 and 3", err)
	}
}

// 10^5 scattered ranges, the largest manifests expected, decode and
// validate; an overlap between the first and the last is found.
func TestManyRanges(t *testing.T) {
	const n = 100_000
	l := layout.Single(2 * n * page)
	ranges := make([]Range, n)
	for i := range ranges {
		// Every other page, in a scattered but deterministic order.
		ranges[i] = Range{Offset: int64((i*7919)%n) * 2 * page, Length: page}
	}
	data, err := Encode(&Manifest{Layout: l, Ranges: ranges})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(data)
	if err != nil || len(m.Ranges) != n || m.TotalBytes() != n*page {
		t.Fatalf("Decode: %v", err)
	}
	ranges[n-1] = Range{Offset: ranges[0].Offset, Length: 2 * page}
	_, err = Encode(&Manifest{Layout: l, Ranges: ranges})
	wantOnly(t, err, ErrOverlap)
}

func TestVerify(t *testing.T) {
	l := layout.Single(64 * page)
	data, err := Encode(&Manifest{Layout: l, Ranges: []Range{{0, 4 * page}}})
	if err != nil {
		t.Fatal(err)
	}
	desc := Describe(data)
	if desc.Size != int64(len(data)) || desc.SHA256 != Digest(data) || len(desc.SHA256) != 64 || strings.ToLower(desc.SHA256) != desc.SHA256 {
		t.Fatalf("Describe = %+v", desc)
	}
	m, err := Verify(data, desc, l)
	if err != nil || m.TotalBytes() != 4*page {
		t.Fatalf("Verify(valid) = %v", err)
	}
	if _, err := Verify(data, Descriptor{SHA256: strings.ToUpper(desc.SHA256), Size: desc.Size}, l); err != nil {
		t.Fatalf("Verify with an upper-case digest = %v", err)
	}

	flipped := bytes.Clone(data)
	flipped[len(flipped)-1] ^= 0x10
	other := layout.Single(128 * page)
	otherRegions := layout.Layout{FileSize: 64 * page, Regions: []layout.Region{region(0, 32*page, page), region(32*page, 32*page, page)}}
	badButDescribed := encodeRaw(Version, l, []Range{{page / 2, page}})
	for _, tc := range []struct {
		name   string
		data   []byte
		desc   Descriptor
		layout layout.Layout
		want   error
	}{
		{"size", data, Descriptor{SHA256: desc.SHA256, Size: desc.Size + 1}, l, ErrSizeMismatch},
		{"truncated file", data[:len(data)-rangeBytes], desc, l, ErrSizeMismatch},
		{"digest", flipped, desc, l, ErrDigestMismatch},
		{"digest not hex", data, Descriptor{SHA256: "nope", Size: desc.Size}, l, ErrDigestMismatch},
		{"file size differs", data, desc, other, ErrLayoutMismatch},
		{"regions differ", data, desc, otherRegions, ErrLayoutMismatch},
		{"described but invalid", badButDescribed, Describe(badButDescribed), l, ErrUnaligned},
		{"oversize", make([]byte, MaxEncodedBytes+1), Descriptor{Size: MaxEncodedBytes + 1}, l, ErrOversize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Verify(tc.data, tc.desc, tc.layout)
			if m != nil {
				t.Errorf("Verify returned a manifest with error %v", err)
			}
			wantOnly(t, err, tc.want)
		})
	}
}

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		name    string
		l       layout.Layout
		touches []int64
		want    []Range
	}{
		{"nothing", layout.Single(16 * page), nil, nil},
		{"sequential run", layout.Single(16 * page), []int64{0, page, 2 * page, 3 * page}, []Range{{0, 4 * page}}},
		{"first-touch order kept", layout.Single(16 * page),
			[]int64{8 * page, 9 * page, 0, page, 10 * page},
			[]Range{{8 * page, 2 * page}, {0, 2 * page}, {10 * page, page}}},
		{"descending is not adjacent", layout.Single(16 * page), []int64{3 * page, 2 * page}, []Range{{3 * page, page}, {2 * page, page}}},
		{"repeats dropped", layout.Single(16 * page),
			[]int64{0, page, 0, 5 * page, page, 2 * page},
			[]Range{{0, 2 * page}, {5 * page, page}, {2 * page, page}}},
		{"repeat between does not break a run", layout.Single(16 * page),
			[]int64{4 * page, 0, 5 * page},
			[]Range{{4 * page, page}, {0, page}, {5 * page, page}}},
		{"offsets inside a page round down", layout.Single(16 * page), []int64{100, page + 5, 4095}, []Range{{0, 2 * page}}},
		{"huge pages", twoRegions,
			[]int64{16 * mib, 16*mib + page, 18 * mib, 17 * mib},
			[]Range{{16 * mib, 2 * huge}}},
		{"adjacent regions are not coalesced", layout.Layout{FileSize: 4 * page, Regions: []layout.Region{region(0, 2*page, page), region(2*page, 2*page, page)}},
			[]int64{0, page, 2 * page, 3 * page},
			[]Range{{0, 2 * page}, {2 * page, 2 * page}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Build(tc.l, tc.touches)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.Ranges, tc.want) {
				t.Fatalf("Build ranges = %v, want %v", m.Ranges, tc.want)
			}
			if _, err := Encode(m); err != nil {
				t.Fatalf("Encode(Build) = %v", err)
			}
		})
	}
	t.Run("touch outside the layout", func(t *testing.T) {
		_, err := Build(twoRegions, []int64{0, 10 * mib})
		wantOnly(t, err, ErrOutsideLayout)
	})
	t.Run("negative touch", func(t *testing.T) {
		_, err := Build(twoRegions, []int64{-page})
		wantOnly(t, err, ErrOutsideLayout)
	})
	t.Run("invalid layout", func(t *testing.T) {
		_, err := Build(layout.Layout{}, []int64{0})
		wantOnly(t, err, layout.ErrInvalid)
	})
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	data, err := Encode(&Manifest{Layout: layout.Single(4 * page), Ranges: []Range{{0, page}}})
	if err != nil {
		t.Fatal(err)
	}
	ok := filepath.Join(dir, "ok.bin")
	big := filepath.Join(dir, "big.bin")
	if err := os.WriteFile(ok, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, make([]byte, MaxEncodedBytes+page), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(ok)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadFile(ok) = %v", err)
	}
	_, err = ReadFile(big)
	wantOnly(t, err, ErrOversize)
	if _, err := ReadFile(filepath.Join(dir, "absent")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadFile(absent) = %v", err)
	}
}

// TestReadFileRefusesWhatIsNotAFile: a symlink (even to a valid manifest),
// a FIFO nobody writes to, a directory: each is refused at once, naming the
// path, without blocking in open(2).
func TestReadFileRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	data, err := Encode(&Manifest{Layout: layout.Single(4 * page), Ranges: []Range{{0, page}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "ok.bin")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.bin")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.bin")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{link, fifo, dir} {
		done := make(chan error, 1)
		go func() {
			_, err := ReadFile(path)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, untrusted.ErrNotRegular) || !strings.Contains(err.Error(), path) {
				t.Errorf("ReadFile(%s) = %v, want untrusted.ErrNotRegular naming the path", path, err)
			}
		case <-time.After(10 * time.Second):
			// A writer lets a reader blocked in open(2) go on.
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			t.Fatalf("ReadFile(%s) blocked", path)
		}
	}
}

func BenchmarkDecode100k(b *testing.B) {
	const n = 100_000
	ranges := make([]Range, n)
	for i := range ranges {
		ranges[i] = Range{Offset: int64((i*7919)%n) * 2 * page, Length: page}
	}
	data, err := Encode(&Manifest{Layout: layout.Single(2 * n * page), Ranges: ranges})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	// A 128 MiB guest touching 14,472 pages in runs of 8, as a startup does.
	l := layout.Single(128 * mib)
	touches := make([]int64, 0, 14472)
	for i := 0; len(touches) < cap(touches); i++ {
		base := int64((i*104729)%(32768/8)) * 8 * page
		for j := range int64(8) {
			touches = append(touches, base+j*page)
		}
	}
	for b.Loop() {
		if _, err := Build(l, touches); err != nil {
			b.Fatal(err)
		}
	}
}

// A stored field above math.MaxInt64 is refused naming the value the file
// holds, as a hex dump of it shows, never as a negative number.
func TestDecodeNamesHugeFieldsUnsigned(t *testing.T) {
	good := layout.Single(64 * page)
	const stored = "18446744073709547520" // 2^64 - 4096, stored as -page
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"range offset", encodeRaw(Version, good, []Range{{-page, page}}), ErrOutsideLayout},
		{"range length", encodeRaw(Version, good, []Range{{page, -page}}), ErrOutsideLayout},
		{"file size", encodeRaw(Version, layout.Layout{FileSize: -page, Regions: []layout.Region{region(0, page, page)}}, nil), layout.ErrInvalid},
		{"region offset", encodeRaw(Version, layout.Layout{FileSize: page, Regions: []layout.Region{region(-page, page, page)}}, nil), layout.ErrInvalid},
		{"region size", encodeRaw(Version, layout.Layout{FileSize: page, Regions: []layout.Region{region(0, -page, page)}}, nil), layout.ErrInvalid},
		{"page size", encodeRaw(Version, layout.Layout{FileSize: page, Regions: []layout.Region{region(0, page, -page)}}, nil), layout.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.data)
			wantOnly(t, err, tc.want)
			if msg := err.Error(); !strings.Contains(msg, stored) || strings.Contains(msg, "-1") {
				t.Fatalf("error %q does not name the stored value %s", msg, stored)
			}
		})
	}
}
