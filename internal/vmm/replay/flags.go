package replay

import (
	"fmt"
	"io"
	"os"
	"strings"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
)

// Flags are the command-line flags of the replay-vmm verb, as given, so
// that a person can run the replay VMM in the foreground.
type Flags struct {
	Backend, MemPath, Layout, TracePath, Remove string
	ControlFD                                   int
	Paused                                      bool
}

// FlagError marks an error in how the replay-vmm verb was called, which the
// CLI reports as a usage error.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

func flagError(format string, args ...any) error {
	return &FlagError{fmt.Errorf(format, args...)}
}

// RunFlags runs the replay VMM the flags describe in the foreground,
// reading commands from stdin and writing events to stdout or the control
// descriptor.
func RunFlags(f Flags, stdout io.Writer, stdin io.Reader) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	control := stdout
	if f.ControlFD != 1 {
		control = os.NewFile(uintptr(f.ControlFD), "control")
	}
	return Run(cfg, control, ReadCommands(stdin))
}

func (f Flags) config() (Config, error) {
	cfg := Config{MemPath: f.MemPath, TracePath: f.TracePath, Paused: f.Paused}
	switch strings.ToLower(f.Backend) {
	case "file":
		cfg.Backend = vmm.BackendFile
	case "uffd":
		cfg.Backend = vmm.BackendUffd
	default:
		return Config{}, flagError("replay-vmm: --backend %q: want File or Uffd", f.Backend)
	}
	if f.MemPath == "" || f.TracePath == "" {
		return Config{}, flagError("replay-vmm: --mem and --trace are required")
	}
	l, err := flagLayout(cfg.Backend, f.MemPath, f.Layout)
	if err != nil {
		return Config{}, fmt.Errorf("replay-vmm: %w", err)
	}
	cfg.Layout = l
	if cfg.Remove, err = parseRanges(f.Remove); err != nil {
		return Config{}, flagError("replay-vmm: --remove: %w", err)
	}
	return cfg, nil
}

// flagLayout reads --layout. The memory file's size bounds the layout in
// File mode; in Uffd mode there is no file here, so the regions define it.
func flagLayout(backend vmm.Backend, memPath, spec string) (layout.Layout, error) {
	if backend == vmm.BackendFile {
		fi, err := os.Stat(memPath)
		if err != nil {
			return layout.Layout{}, err
		}
		l, err := layout.Parse(spec, fi.Size())
		if err != nil {
			return layout.Layout{}, flagError("--layout: %w", err)
		}
		return l, nil
	}
	if strings.TrimSpace(spec) == "" {
		return layout.Layout{}, flagError("--layout is required with the Uffd backend")
	}
	l, err := layout.Parse(spec, 1<<62)
	if err != nil {
		return layout.Layout{}, flagError("--layout: %w", err)
	}
	l.FileSize = l.Regions[len(l.Regions)-1].End()
	return l, nil
}

// parseRanges reads "offset:length,...", sizes as layout.ParseSize reads them.
func parseRanges(s string) ([]Range, error) {
	var out []Range
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		off, length, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("range %q: want offset:length", part)
		}
		o, err := layout.ParseSize(off)
		if err != nil {
			return nil, fmt.Errorf("range %q: %w", part, err)
		}
		n, err := layout.ParseSize(length)
		if err != nil {
			return nil, fmt.Errorf("range %q: %w", part, err)
		}
		out = append(out, Range{Offset: o, Length: n})
	}
	return out, nil
}
