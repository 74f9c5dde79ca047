package repository

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"warmstart/internal/layout"
)

func TestValidateID(t *testing.T) {
	id, err := NewID()
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateID(id); err != nil {
		t.Fatalf("NewID gave %q: %v", id, err)
	}
	bad := []string{"", "..", "/", id + "/", strings.ToUpper(id), "{" + id + "}", "urn:uuid:" + id,
		strings.ReplaceAll(id, "-", ""), uuid.Must(uuid.NewRandom()).String(), uuid.Nil.String(), id[:35] + "\x00"}
	for _, s := range bad {
		if err := ValidateID(s); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalidRequest", s, err)
		}
	}
}

func TestValidateAlias(t *testing.T) {
	good := []string{"a", "web-1", "A_b-C", strings.Repeat("x", MaxAliasBytes), "0123"}
	for _, s := range good {
		if err := ValidateAlias(s); err != nil {
			t.Errorf("ValidateAlias(%q) = %v", s, err)
		}
	}
	id, _ := NewID()
	bad := []string{"", ".", "..", "a/b", "a b", "a\x00", strings.Repeat("x", MaxAliasBytes+1), "é", id, strings.ReplaceAll(id, "-", "")}
	for _, s := range bad {
		if err := ValidateAlias(s); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("ValidateAlias(%q) = %v, want ErrInvalidRequest", s, err)
		}
	}
}

// An alias a command line would read as a flag is refused for a new
// binding, naming the rule, and still accepted where an existing one is
// read or looked up.
func TestValidateNewAliasRefusesALeadingDash(t *testing.T) {
	for _, s := range []string{"-x", "--json", "-"} {
		err := ValidateNewAlias(s)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "'-'") {
			t.Errorf("ValidateNewAlias(%q) = %v, want ErrInvalidRequest naming '-'", s, err)
		}
		if err := ValidateAlias(s); err != nil {
			t.Errorf("ValidateAlias(%q) = %v: an alias bound earlier must still read", s, err)
		}
	}
	for _, s := range []string{"a-", "web-1", "_x"} {
		if err := ValidateNewAlias(s); err != nil {
			t.Errorf("ValidateNewAlias(%q) = %v", s, err)
		}
	}
	if err := ValidateNewAlias("a b"); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("ValidateNewAlias keeps ValidateAlias's rules: %v", err)
	}
}

func TestValidateRef(t *testing.T) {
	id, _ := NewID()
	for _, s := range []string{id, "web-1", strings.Repeat("x", MaxAliasBytes)} {
		if err := ValidateRef(s); err != nil {
			t.Errorf("ValidateRef(%q) = %v", s, err)
		}
	}
	// An uppercase id is taken as an id (Lookup would), so refused as one.
	for _, s := range []string{"", "a/b", strings.Repeat("x", MaxAliasBytes+1), strings.ToUpper(id), uuid.Nil.String()} {
		if err := ValidateRef(s); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("ValidateRef(%q) = %v, want ErrInvalidRequest", s, err)
		}
	}
}

func TestFilterMatch(t *testing.T) {
	yes, no := true, false
	withManifest := Record{Alias: "web-1", Manifest: &ManifestDescriptor{}}
	plain := Record{}
	cases := []struct {
		f    Filter
		r    Record
		want bool
	}{
		{Filter{}, plain, true},
		{Filter{AliasPrefix: "web"}, withManifest, true},
		{Filter{AliasPrefix: "web-1x"}, withManifest, false},
		{Filter{AliasPrefix: "w"}, plain, false},
		{Filter{HasManifest: &yes}, withManifest, true},
		{Filter{HasManifest: &yes}, plain, false},
		{Filter{HasManifest: &no}, plain, true},
		{Filter{AliasPrefix: "web", HasManifest: &no}, withManifest, false},
	}
	for _, c := range cases {
		if got := c.f.Match(c.r); got != c.want {
			t.Errorf("%+v.Match(%+v) = %v", c.f, c.r, got)
		}
	}
}

func TestRecordValidate(t *testing.T) {
	id, _ := NewID()
	sum := strings.Repeat("ab", 32)
	good := Record{Format: RecordFormatVersion, ID: id, Alias: "a", CreatedAt: time.Now(), Layout: layout.Single(8192),
		VMStateSize: 10, VMStateSHA256: sum, MemorySize: 8192, MemorySHA256: sum,
		Manifest: &ManifestDescriptor{SHA256: sum, Size: 10}, MemoryFormat: MemoryFormatRaw}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	chunked := good
	chunked.MemoryFormat = MemoryFormatChunks
	chunked.MemoryChunks = &ChunkMapDescriptor{SHA256: sum, Size: 100, ChunkBytes: 1 << 20, StoredBytes: 50}
	chunked.StartupPack = &StartupPackDescriptor{ManifestSHA256: sum, IndexSHA256: sum, IndexSize: 80, StoredBytes: 9, LogicalBytes: 10}
	if err := chunked.Validate(); err != nil {
		t.Fatal(err)
	}
	refined := chunked
	refined.Refinement = &RefinementDescriptor{SHA256: sum, Size: 40, ManifestSHA256: sum, ManifestSize: 20, BaseSHA256: sum}
	refined.RefinedPack = &StartupPackDescriptor{ManifestSHA256: strings.Repeat("cd", 32), IndexSHA256: sum, IndexSize: 80, StoredBytes: 9, LogicalBytes: 10}
	if err := refined.Validate(); err != nil {
		t.Fatalf("a record with a pack of an older refinement: %v", err)
	}
	recorded := good
	recorded.ManifestRecording = &Recording{Runs: 2, Overlap: ptr(0.5), RankCorrelation: ptr(-1.0)}
	if err := recorded.Validate(); err != nil {
		t.Fatalf("a record with a two-run recording: %v", err)
	}
	old := good
	old.Format, old.MemoryFormat = 1, ""
	if err := old.Validate(); err != nil {
		t.Fatalf("a format-1 record with no memory format: %v", err)
	}
	breaks := map[string]func(*Record){
		"future format":       func(r *Record) { r.Format = RecordFormatLayered + 1 },
		"plain format 3":      func(r *Record) { r.MemoryFormat = MemoryFormatLayers },
		"parent in format 2":  func(r *Record) { r.Parent = r.ID },
		"bad id":              func(r *Record) { r.ID = "../x" },
		"bad alias":           func(r *Record) { r.Alias = "a/b" },
		"layout size differs": func(r *Record) { r.MemorySize = 4096 },
		"invalid layout":      func(r *Record) { r.Layout.Regions = nil },
		"uppercase digest":    func(r *Record) { r.MemorySHA256 = strings.ToUpper(sum) },
		"short digest":        func(r *Record) { r.VMStateSHA256 = "ab" },
		"empty manifest":      func(r *Record) { r.Manifest = &ManifestDescriptor{SHA256: sum} },
		"no memory format":    func(r *Record) { r.MemoryFormat = "" },
		"unknown format":      func(r *Record) { r.MemoryFormat = "chunks-v9" },
		"chunks without map":  func(r *Record) { r.MemoryFormat = MemoryFormatChunks },
		"map for raw memory": func(r *Record) {
			r.MemoryChunks = &ChunkMapDescriptor{SHA256: sum, Size: 1, ChunkBytes: 4096}
		},
		"recording without manifest": func(r *Record) { r.Manifest, r.ManifestRecording = nil, &Recording{Runs: 1} },
		"recording of three runs":    func(r *Record) { r.ManifestRecording = &Recording{Runs: 3} },
		"recording overlap above 1":  func(r *Record) { r.ManifestRecording = &Recording{Runs: 2, Overlap: ptr(1.5)} },
		"recording overlap NaN":      func(r *Record) { r.ManifestRecording = &Recording{Runs: 2, Overlap: ptr(math.NaN())} },
		"recording correlation < -1": func(r *Record) { r.ManifestRecording = &Recording{Runs: 2, RankCorrelation: ptr(-1.01)} },
		"pack of another manifest": func(r *Record) {
			r.StartupPack = &StartupPackDescriptor{ManifestSHA256: strings.Repeat("cd", 32), IndexSHA256: sum, IndexSize: 1, StoredBytes: 1, LogicalBytes: 1}
		},
		"refined pack without refinement": func(r *Record) {
			r.RefinedPack = &StartupPackDescriptor{ManifestSHA256: sum, IndexSHA256: sum, IndexSize: 1, StoredBytes: 1, LogicalBytes: 1}
		},
		"refined pack malformed": func(r *Record) {
			r.Refinement = &RefinementDescriptor{SHA256: sum, Size: 40, ManifestSHA256: sum, ManifestSize: 20, BaseSHA256: sum}
			r.RefinedPack = &StartupPackDescriptor{ManifestSHA256: sum, IndexSHA256: "x", IndexSize: 1, StoredBytes: 1, LogicalBytes: 1}
		},
	}
	for name, edit := range breaks {
		r := good
		m := *good.Manifest
		r.Manifest = &m
		edit(&r)
		if err := r.Validate(); !errors.Is(err, ErrIntegrity) {
			t.Errorf("%s: Validate = %v, want ErrIntegrity", name, err)
		}
	}
}

func TestTypedErrors(t *testing.T) {
	var err error = &AliasConflictError{Alias: "a", HolderID: "x"}
	if !errors.Is(err, ErrAliasConflict) || errors.Is(err, ErrNotFound) {
		t.Fatalf("AliasConflictError matches wrongly: %v", err)
	}
	err = &IntegrityError{Artifact: MemoryFileName, Want: "a", Got: "b"}
	var ie *IntegrityError
	if !errors.Is(err, ErrIntegrity) || !errors.As(err, &ie) || ie.Artifact != MemoryFileName {
		t.Fatalf("IntegrityError matches wrongly: %v", err)
	}
}

func ptr(v float64) *float64 { return &v }
