// Package labcmd holds the lab's verbs — bench, demo, synth and the hidden
// replay-vmm, which plays synth's traces — that cmd/warmstart adds to its
// command tree: the built-in benchmark and the demo are features of the
// binary, built from the lab's packages.
package labcmd

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/config"
	"warmstart/internal/interrupt"
	"warmstart/internal/lab/bench"
	"warmstart/internal/lab/chart"
	"warmstart/internal/node"
	"warmstart/internal/restore"
	"warmstart/internal/untrusted"
)

// benchFlags are bench's flags.
type benchFlags struct {
	env      *cli.Env
	vf       cli.VMMFlags
	b        bench.Flags
	asJSON   bool
	jsonFile string
	s3f      s3BenchFlags
	agent    string
	pause    pauseBenchFlags
}

// s3BenchFlags are the bench flags of --repository s3.
type s3BenchFlags struct {
	latencyMs     int
	bandwidthMbit int64
	linkMbit      int64
}

// Bench is the bench verb; env is the command line's configuration.
func Bench(env *cli.Env) *cobra.Command {
	f := benchFlags{env: env}
	cmd := &cobra.Command{
		Use:   "bench [SNAPSHOT]",
		Short: "Measure startup prefetch with the seed's Experiment 2 protocol",
		Long: `Run the seed's Experiment 2 protocol: blocks of serial restores in a frozen
random order (reproducible from --seed) over the conditions file-warm and
file-cold, prefetch off and each --policies entry, plus a hot control.
Every trial runs in its own process with a private runtime directory, after
an untimed prefetch-off baseline restore whose device release is
acknowledged, on a freshly copied and SHA-256-checked private memory lower
file that is left resident or dropped with one POSIX_FADV_DONTNEED, and is
admitted only if mincore shows all or none of its pages resident just
before the timer. Trials that miss are replaced from reserve blocks.

Without SNAPSHOT the reference snapshot (warmstart synth) is synthesized,
published into a temporary repository and its manifest recorded first.
With SNAPSHOT (id or alias in the configured repository) the VMM is
[vmm] driver unless --vmm names one; the replay VMM plays --trace or
[replay] trace.

--vmm qemu runs the protocol on the real guest: without SNAPSHOT a fresh
guest is booted, captured and published into a temporary repository and its
manifest recorded from its own device reads first (as warmstart capture
does). Each trial checks that the guest agent answered with the captured
guest's token and heap digest and that the trial's private lower file is unchanged; for a
SNAPSHOT they are learned by one excluded pilot trial.

A --policies entry ending in +noverify (warmstart+noverify, off+noverify)
restores without checking memory against the snapshot's digest table; next
to the same entry without it, it measures what verification costs, paired
within blocks.

--drift F (reference snapshot, replay VMM) makes the guest's start-up drift
as a real guest's does: every trial of every condition plays its own
variant of the trace (warmstart synth --variants), which differs from the
base by a fraction F of touched pages and in a locally perturbed order,
while the manifest stays the one recorded from the base. Every run reports,
per condition, the startup-set outcomes of the timed restores: pages in
time, late, unused and missed.

A --policies entry ending in +learned (warmstart+learned) prefetches the
manifest that --learn N learning restores (default 3; file-cold, that
policy, each on its own variant of the trace with --drift) refined from the
recorded one, as a node's learner refines it from the restores it serves;
next to the same policy without it, it measures what learning buys, paired
within blocks.`,
		Args: cli.Args(cli.OptionalSnapshotArg),
		RunE: f.run,
	}
	f.register(cmd)
	return cmd
}

// run benchmarks the snapshot args name, or the reference snapshot.
func (f *benchFlags) run(cmd *cobra.Command, args []string) error {
	var snapshot string
	if len(args) == 1 {
		snapshot = args[0]
	}
	// Bad flags are refused before any snapshot is synthesized or booted.
	size, err := f.b.Check(snapshot)
	if err != nil {
		return cli.Error{Err: err}
	}
	if err := cli.CheckFileFlag("--plot", f.b.Plot, chart.CheckPath); err != nil {
		return err
	}
	if err := cli.CheckFileFlag("--json-file", f.jsonFile, untrusted.CheckCreatable); err != nil {
		return err
	}
	if f.pause.on {
		return f.runPause(cmd, size)
	}
	if f.b.Repository == "s3" {
		return f.execS3(cmd, size)
	}
	// From here on a signal stops the run, which then cleans up.
	in := interrupt.Notify(cmd.ErrOrStderr())
	f.b.Kill = in.Force.Done()
	rep, err := f.runBench(in.Work, cmd, snapshot, size)
	if err == nil {
		err = rep.Write(cmd.OutOrStdout(), cmd.ErrOrStderr(), f.asJSON, f.jsonFile)
	}
	if err == nil && f.b.Plot != "" {
		if err = rep.Plot(f.b.Plot); err == nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", f.b.Plot)
		}
	}
	return in.Result(err)
}

// register gives cmd bench's flags.
func (f *benchFlags) register(cmd *cobra.Command) {
	f.vf.Register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.b.Repository, "repository", "posix_fs", "posix_fs, or s3: a MinIO on loopback behind a Toxiproxy link (runs the warmstart-s3bench command, built from ./cmd/warmstart-s3bench; needs the minio binary, see .ci/minio.sh)")
	fl.IntVar(&f.s3f.latencyMs, "s3-latency-ms", 5, "--repository s3: latency added to every object-store response")
	fl.Int64Var(&f.s3f.bandwidthMbit, "s3-bandwidth-mbit", 1000, "--repository s3: bandwidth of each object-store connection")
	fl.Int64Var(&f.s3f.linkMbit, "s3-link-mbit", 1000, "--repository s3: bandwidth of the node's link, all object-store connections together")
	fl.IntVar(&f.b.Blocks, "blocks", 8, "formal blocks of the protocol")
	fl.IntVar(&f.b.ReserveBlocks, "reserve-blocks", 2, "reserve blocks that replace trials missing admission")
	fl.StringVar(&f.b.Device, "device", config.DeviceFile, "memory device: file (FUSE) or uffd")
	// The flag takes what restore's and [memory] io_engine take: a name
	// or the seed's integer.
	fl.Var((*config.IOEngineSetting)(&f.b.IOEngine), "io-engine", "I/O engine of the file device: buffered (0) or buffered_async (1); direct (2) skips prefetch by design")
	fl.Uint64Var(&f.b.Seed, "seed", 1, "seed of the frozen random order (and of the reference snapshot)")
	fl.StringVar(&f.b.PolicyList, "policies", "seed,warmstart", "prefetch policies to compare: "+strings.Join(restore.PolicyNames(), ","))
	fl.BoolVar(&f.asJSON, "json", false, "print all raw trials and the summary as JSON on stdout (the table goes to stderr)")
	fl.StringVar(&f.jsonFile, "json-file", "", "also write the JSON report to this file")
	fl.StringVar(&f.b.Plot, "plot", "", "draw every trial's time to ready and bytes read per cache state and policy to FILE.svg or FILE.png")
	fl.StringVar(&f.b.MemorySize, "memory-size", "128MiB", "guest memory of the reference snapshot")
	fl.BoolVar(&f.b.NoHot, "no-hot", false, "leave out the hot control")
	fl.Float64Var(&f.b.Drift, "drift", 0, "reference snapshot: every trial plays its own variant of the trace that differs from the base by this fraction of touched pages (0 to 1; 0: the base trace)")
	fl.IntVar(&f.b.Learn, "learn", bench.DefaultLearn, "learning restores of each +learned column before the formal blocks")
	fl.IntVar(&f.b.Concurrency, "concurrency", 1, fmt.Sprintf("timed restores each trial starts at once on its node, 1 to %d, sharing the device and the prefetch task (replay VMM; a trial's time is the slowest's): N cold against N hot", bench.MaxConcurrency))
	fl.StringVar(&f.b.CPUProfileDir, "cpuprofile", "", "write a CPU profile (pprof) of the node process in each formal trial's timed restore, start to ready, into this directory (block-N-CACHE-POLICY.pprof; compare a cold one with a hot one: go tool pprof -diff_base block-1-hot-off.pprof block-1-cold-warmstart.pprof)")
	fl.StringVar(&f.agent, "agent", "", "--vmm qemu without SNAPSHOT: prebuilt warmstart-agent binary (default: build it from the module source)")
	fl.String(cli.StoreFlag, "", "POSIX snapshot store directory (overrides [backend.posix_fs] snapshot_store)")
	f.pause.register(cmd)
}

// s3FixedFlags are the bench flags whose setting the S3 companion fixes:
// it benchmarks the reference snapshot on the replay VMM and the file
// device (I/O engine 0), without reserve blocks or learning restores. A
// flag set to anything else would go unheeded, and the run would measure
// something other than what the operator asked for; "" means any setting.
var s3FixedFlags = map[string]string{
	"device": config.DeviceFile, "io-engine": config.IOEngineNames[0], "vmm": config.DriverReplay,
	"reserve-blocks": "", "learn": "", "cpuprofile": "", "concurrency": "1", "agent": "", "trace": "", cli.StoreFlag: "",
}

// checkS3Flags refuses a flag set to what the S3 companion does not do.
func checkS3Flags(cmd *cobra.Command) error {
	for _, name := range slices.Sorted(maps.Keys(s3FixedFlags)) {
		fl := cmd.Flags().Lookup(name)
		if fl == nil || !fl.Changed || (s3FixedFlags[name] != "" && fl.Value.String() == s3FixedFlags[name]) {
			continue
		}
		return cli.Error{Err: fmt.Errorf("--%s %s: not available with --repository s3, which benchmarks the reference snapshot on the replay VMM and the file device", name, fl.Value.String())}
	}
	return nil
}

// execS3 replaces this process with the S3 companion command, passing on
// the flags and the configuration's [memory] readaround windows. The
// companion watches for signals itself.
func (f *benchFlags) execS3(cmd *cobra.Command, size int64) error {
	if err := checkS3Flags(cmd); err != nil {
		return err
	}
	cfg, err := f.env.Config()
	if err != nil {
		return err
	}
	return bench.ExecS3(bench.S3Options{Blocks: f.b.Blocks, Seed: f.b.Seed, MemBytes: size, Policy: f.b.Policies[0],
		JSON: f.asJSON, JSONFile: f.jsonFile, Plot: f.b.Plot, LatencyMs: f.s3f.latencyMs, BandwidthMbit: f.s3f.bandwidthMbit,
		LinkMbit: f.s3f.linkMbit, ReadaroundKiB: cfg.Memory.ReadaroundKiB,
		PrefetchReadaroundKiB: cfg.Memory.PrefetchReadaroundKiB})
}

// runBench runs the protocol on snapshot, or on a freshly prepared
// reference snapshot when snapshot is empty.
func (f *benchFlags) runBench(ctx context.Context, cmd *cobra.Command, snapshot string, memBytes int64) (*bench.Report, error) {
	o := f.b.Options
	o.Progress = cmd.ErrOrStderr()
	if err := bench.CheckReferenceVMM(snapshot, f.vf.Kind, o.Drift); err != nil {
		return nil, cli.Error{Err: err}
	}
	return bench.RunOn(ctx, o, bench.Target{
		Snapshot: snapshot, Open: func() (*node.Node, error) { return f.env.OpenNode(ctx, cmd, &f.vf) },
		Guest: f.vf.Kind == config.DriverQEMU, Config: f.env.Config, Agent: f.agent, MemBytes: memBytes,
	})
}
