package labcmd

import (
	"errors"
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/vmm/replay"
)

// ReplayVMM is the hidden replay-vmm verb: the stand-in VMM that plays a
// synth trace, run by hand.
func ReplayVMM() *cobra.Command {
	var f replay.Flags
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
			err := replay.RunFlags(f, cmd.OutOrStdout(), os.Stdin)
			if fe := (*replay.FlagError)(nil); errors.As(err, &fe) {
				return cli.Error{Err: err}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&f.Backend, "backend", "File", "memory backend: File or Uffd")
	cmd.Flags().StringVar(&f.MemPath, "mem", "", "memory file (File) or page-fault handler socket (Uffd)")
	cmd.Flags().StringVar(&f.Layout, "layout", "", "memory layout offset:size[:pagesize],... (File default: the whole file)")
	cmd.Flags().StringVar(&f.TracePath, "trace", "", "startup trace to play")
	cmd.Flags().StringVar(&f.Remove, "remove", "", "ranges offset:length,... to drop and touch again after the trace (Uffd)")
	cmd.Flags().IntVar(&f.ControlFD, "control-fd", 1, "file descriptor receiving the JSON-line events")
	cmd.Flags().BoolVar(&f.Paused, "paused", false, "map memory, then wait for \"resume\" on standard input")
	return cmd
}
