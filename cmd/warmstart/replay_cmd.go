package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

func init() {
	var (
		backend   string
		memPath   string
		spec      string
		tracePath string
		remove    string
		controlFD int
		paused    bool
	)
	cmd := &cobra.Command{
		Use:    "replay-vmm --trace FILE --mem PATH [--backend File|Uffd] [--layout SPEC] [--remove OFF:LEN,...]",
		Short:  "Run the replay VMM: map snapshot memory as Firecracker does and touch it in startup-trace order",
		Hidden: true,
		Long: `Run the replay VMM in the foreground. With --backend File it maps the memory
file at --mem MAP_PRIVATE, one mapping per layout region; with --backend Uffd
it maps anonymous memory, registers it with a userfaultfd and hands it to the
page-fault handler listening on the Unix socket at --mem. It then touches the
pages of --trace in order and prints JSON-line events (started, ready with
the SHA-256 of the bytes read and the timings, error, stopped) to standard
output or --control-fd. With --paused it maps memory and waits for a line
"resume" on standard input before touching anything. It stops when standard
input reads "stop" or ends, or on SIGINT or SIGTERM.

--layout takes "offset:size[:pagesize],..." (the content of a synth layout
file); in File mode it defaults to one region covering the memory file.
--remove drops the given ranges with MADV_DONTNEED after the trace and
touches them again (Uffd only).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := replay.Config{MemPath: memPath, TracePath: tracePath, Paused: paused}
			switch strings.ToLower(backend) {
			case "file":
				cfg.Backend = vmm.BackendFile
			case "uffd":
				cfg.Backend = vmm.BackendUffd
			default:
				return usageError{fmt.Errorf("replay-vmm: --backend %q: want File or Uffd", backend)}
			}
			if memPath == "" || tracePath == "" {
				return usageError{fmt.Errorf("replay-vmm: --mem and --trace are required")}
			}
			l, err := replayLayout(cfg.Backend, memPath, spec)
			if err != nil {
				return fmt.Errorf("replay-vmm: %w", err)
			}
			cfg.Layout = l
			if cfg.Remove, err = parseRanges(remove); err != nil {
				return usageError{fmt.Errorf("replay-vmm: --remove: %w", err)}
			}
			var control io.Writer = cmd.OutOrStdout()
			if controlFD != 1 {
				control = os.NewFile(uintptr(controlFD), "control")
			}
			return replay.Run(cfg, control, replay.ReadCommands(os.Stdin))
		},
	}
	cmd.Flags().StringVar(&backend, "backend", "File", "memory backend: File or Uffd")
	cmd.Flags().StringVar(&memPath, "mem", "", "memory file (File) or page-fault handler socket (Uffd)")
	cmd.Flags().StringVar(&spec, "layout", "", "memory layout offset:size[:pagesize],... (File default: the whole file)")
	cmd.Flags().StringVar(&tracePath, "trace", "", "startup trace to play")
	cmd.Flags().StringVar(&remove, "remove", "", "ranges offset:length,... to drop and touch again after the trace (Uffd)")
	cmd.Flags().IntVar(&controlFD, "control-fd", 1, "file descriptor receiving the JSON-line events")
	cmd.Flags().BoolVar(&paused, "paused", false, "map memory, then wait for \"resume\" on standard input")
	rootCmd.AddCommand(cmd)
}

// replayLayout reads --layout. The memory file's size bounds the layout in
// File mode; in Uffd mode there is no file here, so the regions define it.
func replayLayout(backend vmm.Backend, memPath, spec string) (layout.Layout, error) {
	if backend == vmm.BackendFile {
		fi, err := os.Stat(memPath)
		if err != nil {
			return layout.Layout{}, err
		}
		l, err := layout.Parse(spec, fi.Size())
		if err != nil {
			return layout.Layout{}, usageError{fmt.Errorf("--layout: %w", err)}
		}
		return l, nil
	}
	if strings.TrimSpace(spec) == "" {
		return layout.Layout{}, usageError{fmt.Errorf("--layout is required with the Uffd backend")}
	}
	l, err := layout.Parse(spec, 1<<62)
	if err != nil {
		return layout.Layout{}, usageError{fmt.Errorf("--layout: %w", err)}
	}
	l.FileSize = l.Regions[len(l.Regions)-1].End()
	return l, nil
}

// parseRanges reads "offset:length,...", sizes as layout.ParseSize reads them.
func parseRanges(s string) ([]replay.Range, error) {
	var out []replay.Range
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
		out = append(out, replay.Range{Offset: o, Length: n})
	}
	return out, nil
}
