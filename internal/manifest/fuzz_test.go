package manifest

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"warmstart/internal/layout"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the FuzzDecode seed corpus in testdata")

// FuzzDecode checks that Decode never panics and that whatever it accepts
// is valid and re-encodes to exactly the input: the encoding has one form,
// so an accepted file is never silently reinterpreted.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			if m != nil {
				t.Fatalf("Decode returned a manifest and error %v", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("Decode accepted a manifest that fails Validate: %v", err)
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode(Decode(data)) = %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, data)
		}
	})
}

// seedCorpus is FuzzDecode's seed corpus: a valid manifest of each shape
// and one input per rejection, with the error it must give (nil: valid).
func seedCorpus() []struct {
	name string
	data []byte
	want error
} {
	single := layout.Single(256 * page)
	valid := encodeRaw(Version, single, []Range{{8 * page, 4 * page}, {0, page}, {100 * page, 16 * page}})
	return []struct {
		name string
		data []byte
		want error
	}{
		{"valid_single_region", valid, nil},
		{"valid_two_regions", encodeRaw(Version, twoRegions, []Range{{16 * mib, huge}, {0, 8 * page}, {24 * mib, 2 * huge}}), nil},
		{"valid_no_ranges", encodeRaw(Version, single, nil), nil},
		{"truncated_header", valid[:headerBytes-3], ErrTruncated},
		{"truncated_range", valid[:len(valid)-5], ErrTruncated},
		{"trailing_data", append(bytes.Clone(valid), 1, 2, 3), ErrTrailingData},
		{"bad_magic", append([]byte("WSMANIF\x7f"), valid[8:]...), ErrBadMagic},
		{"unsupported_version", encodeRaw(7, single, []Range{{0, page}}), ErrUnsupportedVersion},
		{"overlap", encodeRaw(Version, single, []Range{{8 * page, 4 * page}, {0, page}, {10 * page, page}}), ErrOverlap},
		{"unaligned", encodeRaw(Version, twoRegions, []Range{{16*mib + page, huge}}), ErrUnaligned},
		{"outside_layout", encodeRaw(Version, twoRegions, []Range{{10 * mib, page}}), ErrOutsideLayout},
		{"bad_layout", encodeRaw(Version, layout.Layout{FileSize: page, Regions: []layout.Region{region(page, page, page)}}, nil), layout.ErrInvalid},
	}
}

// TestFuzzSeedCorpus keeps the files in testdata/fuzz/FuzzDecode what
// their names say; go test runs them through FuzzDecode as well.
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for _, seed := range seedCorpus() {
		path := filepath.Join(dir, seed.name)
		if *updateSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			text := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(seed.data)))
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Run(seed.name, func(t *testing.T) {
			data, err := readCorpusFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestFuzzSeedCorpus -update-seeds)", err)
			}
			if !bytes.Equal(data, seed.data) {
				t.Fatalf("%s is stale (run go test -run TestFuzzSeedCorpus -update-seeds)", path)
			}
			_, err = Decode(data)
			if seed.want == nil {
				if err != nil {
					t.Fatalf("Decode(%s) = %v", seed.name, err)
				}
				return
			}
			wantOnly(t, err, seed.want)
		})
	}
}

// readCorpusFile reads a one-value []byte corpus file of the form the go
// command writes.
func readCorpusFile(path string) ([]byte, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	header, body, ok := strings.Cut(string(text), "\n")
	body = strings.TrimSpace(body)
	if !ok || header != "go test fuzz v1" || !strings.HasPrefix(body, "[]byte(") || !strings.HasSuffix(body, ")") {
		return nil, errors.New(path + ": not a go test fuzz v1 file holding one []byte")
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(body, "[]byte("), ")"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return []byte(s), nil
}
