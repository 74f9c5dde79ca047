package replay

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestFlagsRefuseBadFlagsAsFlagErrors: every flag the replay-vmm verb
// refuses is a *FlagError naming the flag, so the CLI exits 2 for it; a
// missing memory file is not the caller's spelling and is no FlagError.
func TestFlagsRefuseBadFlagsAsFlagErrors(t *testing.T) {
	mem := filepath.Join(t.TempDir(), "mem")
	if err := os.WriteFile(mem, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    Flags
		want string
	}{
		{"backend", Flags{Backend: "Disk", MemPath: mem, TracePath: "t"}, `replay-vmm: --backend "Disk": want File or Uffd`},
		{"required", Flags{Backend: "File", TracePath: "t"}, "replay-vmm: --mem and --trace are required"},
		{"layout", Flags{Backend: "File", MemPath: mem, TracePath: "t", Layout: "0:1MiB"}, "replay-vmm: --layout: "},
		{"uffd layout", Flags{Backend: "Uffd", MemPath: "sock", TracePath: "t"}, "replay-vmm: --layout is required with the Uffd backend"},
		{"remove", Flags{Backend: "File", MemPath: mem, TracePath: "t", Remove: "12"}, `replay-vmm: --remove: range "12": want offset:length`},
	} {
		_, err := tc.f.config()
		var fe *FlagError
		if !errors.As(err, &fe) || len(err.Error()) < len(tc.want) || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("%s: error %v, want a *FlagError starting %q", tc.name, err, tc.want)
		}
	}
	_, err := Flags{Backend: "File", MemPath: filepath.Join(t.TempDir(), "absent"), TracePath: "t"}.config()
	var fe *FlagError
	if err == nil || errors.As(err, &fe) {
		t.Errorf("absent memory file: error %v, want an error that is no *FlagError", err)
	}
	cfg, err := Flags{Backend: "file", MemPath: mem, TracePath: "t", Remove: "0:4096, 4KiB:4KiB"}.config()
	if err != nil || len(cfg.Remove) != 2 || cfg.Remove[1] != (Range{Offset: 4096, Length: 4096}) || cfg.Layout.FileSize != 8192 {
		t.Errorf("good flags: config %+v, error %v", cfg, err)
	}
}
