package layout

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	l, err := Parse("0:64M:4096,128MiB:64MiB", 192<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{FileSize: 192 << 20, Regions: []Region{{0, 64 << 20, 4096}, {128 << 20, 64 << 20, 4096}}}
	if !l.Equal(want) {
		t.Fatalf("got %+v, want %+v", l, want)
	}
	back, err := Parse(l.String(), l.FileSize)
	if err != nil || !back.Equal(l) {
		t.Fatalf("String round trip: %v, %v", back, err)
	}
	if l, err := Parse("", 1<<20); err != nil || !l.Equal(Single(1<<20)) {
		t.Fatalf("empty spec: %v, %v", l, err)
	}
}

func TestInvalidLayouts(t *testing.T) {
	for _, tc := range []struct {
		spec string
		size int64
	}{
		{"0:4096:4096", 0},               // no file
		{"0:8192", 4096},                 // past the end of the file
		{"0:4096:3000", 4096},            // page size not a power of two
		{"0:6000", 8192},                 // size not page aligned
		{"100:4096", 8192},               // offset not page aligned
		{"4096:4096,0:4096", 8192},       // out of order
		{"0:8192,4096:4096", 16384},      // overlapping
		{"0:0", 4096},                    // empty region
		{"0", 4096},                      // malformed
		{"0:4096:4096:1", 4096},          // malformed
		{"x:4096", 4096},                 // not a number
		{"0:9223372036854775807T", 4096}, // overflow
	} {
		if _, err := Parse(tc.spec, tc.size); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q, %d) = %v, want ErrInvalid", tc.spec, tc.size, err)
		}
	}
}

func TestRegionLookups(t *testing.T) {
	l := Layout{FileSize: 40960, Regions: []Region{{0, 8192, 4096}, {16384, 8192, 4096}}}
	for _, tc := range []struct {
		off, n int64
		in     bool
		region int
	}{
		{0, 4096, true, 0},
		{4096, 4096, true, 0},
		{4096, 8192, false, 0}, // crosses out of region 0
		{8192, 4096, false, -1},
		{16384, 8192, true, 1},
		{24576, 1, false, -1},
		{-4096, 4096, false, -1},
		{0, 0, false, 0},
	} {
		if got := l.Contains(tc.off, tc.n); got != tc.in {
			t.Errorf("Contains(%d, %d) = %v, want %v", tc.off, tc.n, got, tc.in)
		}
		i, ok := l.RegionAt(tc.off)
		if ok != (tc.region >= 0) || (ok && i != tc.region) {
			t.Errorf("RegionAt(%d) = %d, %v, want region %d", tc.off, i, ok, tc.region)
		}
	}
	if l.MappedSize() != 16384 {
		t.Errorf("MappedSize %d", l.MappedSize())
	}
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"4096": 4096, "4K": 4096, "128MiB": 128 << 20, "2G": 2 << 30, " 1KiB ": 1024} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v, want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "-1", "1.5M", "M", "10X"} {
		if _, err := ParseSize(s); err == nil {
			t.Errorf("ParseSize(%q) succeeded", s)
		}
	}
}

// A layout has at most MaxRegions regions, whether parsed or built.
func TestRegionLimit(t *testing.T) {
	spec := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf("%d:4096", i*4096)
		}
		return strings.Join(parts, ",")
	}
	size := int64(MaxRegions+1) * 4096
	if l, err := Parse(spec(MaxRegions), size); err != nil || len(l.Regions) != MaxRegions {
		t.Fatalf("Parse(%d regions) = %d regions, %v", MaxRegions, len(l.Regions), err)
	}
	if _, err := Parse(spec(MaxRegions+1), size); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "257 regions") {
		t.Fatalf("Parse(%d regions) = %v, want ErrInvalid naming the count", MaxRegions+1, err)
	}
	l := Layout{FileSize: size}
	for i := range MaxRegions + 1 {
		l.Regions = append(l.Regions, Region{Offset: int64(i) * 4096, Size: 4096, PageSize: 4096})
	}
	if err := l.ValidateNew(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ValidateNew(%d regions) = %v, want ErrInvalid", MaxRegions+1, err)
	}
	if err := l.Validate(); err != nil {
		t.Fatalf("Validate(%d regions) of a stored layout = %v, want nil", MaxRegions+1, err)
	}
}
