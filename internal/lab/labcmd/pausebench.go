package labcmd

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/interrupt"
	"warmstart/internal/lab/bench"
	"warmstart/internal/node"
	"warmstart/internal/vmm/qemu"
)

// pauseBenchFlags are bench --pause's flags.
type pauseBenchFlags struct {
	on           bool
	cycles       int
	writeMiB     int
	resumeTrials int
}

func (p *pauseBenchFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&p.on, "pause", false, "measure pause and resume instead: a captured QEMU guest (--memory-size) restored, changed through its agent and paused into a child, --cycles times in a row")
	fl.IntVar(&p.cycles, "cycles", 8, "--pause: pause/resume cycles")
	fl.IntVar(&p.writeMiB, "write-mib", 16, "--pause: MiB the guest's agent writes each cycle")
	fl.IntVar(&p.resumeTrials, "resume-trials", bench.DefaultResumeTrials, "--pause: trials of the last child's resume (file-cold, hot, file-warm, flattened, recorded manifest)")
}

// runPause is bench --pause.
func (f *benchFlags) runPause(cmd *cobra.Command, memBytes int64) error {
	if f.pause.cycles < 1 || f.pause.writeMiB < 1 || int64(f.pause.writeMiB)<<20 > memBytes/2 {
		return cli.Error{Err: fmt.Errorf("--pause: --cycles %d and --write-mib %d: want at least one cycle writing 1 MiB to half of the guest's memory", f.pause.cycles, f.pause.writeMiB)}
	}
	if f.pause.resumeTrials < 1 {
		return cli.Error{Err: fmt.Errorf("--pause: --resume-trials %d: want at least one", f.pause.resumeTrials)}
	}
	cfg, err := f.env.Config()
	if err != nil {
		return err
	}
	d, err := qemu.New(qemu.Options{MemoryMiB: int(memBytes >> 20)})
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "wspause-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	in := interrupt.Notify(cmd.ErrOrStderr())
	rep, err := bench.RunPause(in.Work, d, bench.PauseOptions{Cycles: f.pause.cycles, WriteMiB: f.pause.writeMiB, ResumeTrials: f.pause.resumeTrials, WorkDir: dir,
		InitramfsCache: node.InitramfsCache(cfg), Agent: f.agent, Progress: cmd.ErrOrStderr()})
	if err == nil {
		err = rep.Write(cmd.OutOrStdout(), cmd.ErrOrStderr(), f.asJSON, f.jsonFile)
	}
	return in.Result(err)
}
