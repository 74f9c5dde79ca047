package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"warmstart/internal/bench"
	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/initramfs"
	"warmstart/internal/interrupt"
	"warmstart/internal/layout"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/reference"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/synth"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

func init() {
	bench.RunTrialIfRequested()
	var (
		vf       vmmFlags
		o        bench.Options
		policies string
		jsonPath string
		memSize  string
		noHot    bool
		s3f      s3BenchFlags
		agent    string
	)
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
With SNAPSHOT (id or alias in the configured repository) the replay VMM
needs --trace.

--vmm qemu runs the protocol on the real guest: without SNAPSHOT a fresh
guest is booted, captured and published into a temporary repository and its
manifest recorded from its own device reads first (as warmstart capture
does). Each trial checks that the guest agent answered with the captured
guest's token and heap digest and that the trial's private lower file is unchanged; for a
SNAPSHOT they are learned by one excluded pilot trial.

A --policies entry ending in +noverify (warmstart+noverify, off+noverify)
restores without checking memory against the snapshot's digest table; next
to the same entry without it, it measures what verification costs, paired
within blocks.`,
		Args: argsAsUsageError(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Policies = splitList(policies)
			o.Hot = !noHot
			// Bad flags are refused before any snapshot is synthesized or booted.
			if o.Blocks < 1 || o.ReserveBlocks < 0 {
				return usageError{fmt.Errorf("--blocks %d, --reserve-blocks %d: want at least 1 and 0", o.Blocks, o.ReserveBlocks)}
			}
			if o.Device != restore.DeviceFile && o.Device != restore.DeviceUffd {
				return usageError{fmt.Errorf("--device %q: want file or uffd", o.Device)}
			}
			if err := checkIOEngineFlag(o.IOEngine); err != nil {
				return err
			}
			if len(o.Policies) == 0 {
				return usageError{fmt.Errorf("--policies: name at least one of %s", strings.Join(restore.PolicyNames(), ", "))}
			}
			for _, p := range o.Policies {
				if err := bench.CheckColumn(p); err != nil {
					return usageError{fmt.Errorf("--policies: %w", err)}
				}
			}
			size, err := layout.ParseSize(memSize)
			if err != nil {
				return usageError{fmt.Errorf("--memory-size: %w", err)}
			}
			var snapshot string
			if len(args) == 1 {
				snapshot = args[0]
			}
			switch s3f.repository {
			case "posix_fs":
			case "s3":
				if snapshot != "" || len(o.Policies) != 1 {
					return usageError{fmt.Errorf("--repository s3 benchmarks the reference snapshot with one --policies entry")}
				}
			default:
				return usageError{fmt.Errorf("--repository %q: want posix_fs or s3", s3f.repository)}
			}
			if s3f.repository == "s3" {
				// The companion command watches for signals itself.
				return runS3Bench(s3f, o.Blocks, o.Seed, size, o.Policies[0], jsonPath)
			}
			// From here on a signal stops the run, which then cleans up.
			in := interrupt.Notify(cmd.ErrOrStderr())
			o.Kill = in.Force.Done()
			rep, err := runBench(in.Work, cmd, &vf, o, snapshot, size, agent, cmd.ErrOrStderr())
			if err == nil {
				err = writeBenchReport(rep, cmd.OutOrStdout(), cmd.ErrOrStderr(), jsonPath)
			}
			return in.Result(err)
		},
	}
	vf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&s3f.repository, "repository", "posix_fs", "posix_fs, or s3: a MinIO on loopback behind a Toxiproxy link (runs the warmstart-s3bench command, built from ./cmd/warmstart-s3bench; needs the minio binary, see .ci/minio.sh)")
	f.IntVar(&s3f.latencyMs, "s3-latency-ms", 5, "--repository s3: latency added to every object-store response")
	f.Int64Var(&s3f.bandwidthMbit, "s3-bandwidth-mbit", 1000, "--repository s3: bandwidth of each object-store connection")
	f.Int64Var(&s3f.linkMbit, "s3-link-mbit", 1000, "--repository s3: bandwidth of the node's link, all object-store connections together")
	f.IntVar(&o.Blocks, "blocks", 8, "formal blocks of the protocol")
	f.IntVar(&o.ReserveBlocks, "reserve-blocks", 2, "reserve blocks that replace trials missing admission")
	f.StringVar(&o.Device, "device", restore.DeviceFile, "memory device: file (FUSE) or uffd")
	f.IntVar(&o.IOEngine, "io-engine", 0, "I/O engine of the file device (0 or 1; 2 skips prefetch by design)")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the frozen random order (and of the reference snapshot)")
	f.StringVar(&policies, "policies", "seed,warmstart", "prefetch policies to compare: "+strings.Join(restore.PolicyNames(), ","))
	f.StringVar(&jsonPath, "json", "", "write all raw trials and the summary to this file")
	f.StringVar(&memSize, "memory-size", "128MiB", "guest memory of the reference snapshot")
	f.BoolVar(&noHot, "no-hot", false, "leave out the hot control")
	f.StringVar(&agent, "agent", "", "--vmm qemu without SNAPSHOT: prebuilt warmstart-agent binary (default: build it from the module source)")
	f.String(storeFlag, "", "POSIX snapshot store directory (overrides [backend.posix_fs] snapshot_store)")
	rootCmd.AddCommand(cmd)
}

// writeBenchReport prints the table, and writes the raw trials and the
// summary to jsonPath when it is set.
func writeBenchReport(rep *bench.Report, out, progress io.Writer, jsonPath string) error {
	rep.WriteTable(out)
	if jsonPath == "" {
		return nil
	}
	data, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(jsonPath, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	fmt.Fprintf(progress, "wrote raw trials and summary to %s\n", jsonPath)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// runBench runs the protocol on snapshot, or on a freshly prepared
// reference snapshot when snapshot is empty.
func runBench(ctx context.Context, cmd *cobra.Command, vf *vmmFlags, o bench.Options, snapshot string, memBytes int64, agent string, progress io.Writer) (_ *bench.Report, err error) {
	o.Progress = progress
	work, err := os.MkdirTemp("", "warmstart-bench-")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, interrupt.RemoveWorkDir(work)) }()
	o.WorkDir = work
	switch {
	case snapshot == "" && vf.kind == "qemu":
		cfg, err := config.Load(configPath)
		if err != nil {
			return nil, err
		}
		d, err := newQEMUDriver(cfg)
		if err != nil {
			return nil, err
		}
		src, ready, err := prepareGuest(ctx, d, work, filepath.Join(cfg.Runtime.Dir, "initramfs"), agent, progress)
		if err != nil {
			return nil, err
		}
		o.Source, o.ExpectedToken, o.ExpectedDigest = src, ready["token"], ready["digest"]
		o.VMM, o.QEMU = bench.VMMQEMU, d.Options()
	case snapshot == "":
		if vf.kind != "replay" {
			return nil, usageError{fmt.Errorf("the reference snapshot needs --vmm replay or qemu; name a snapshot for --vmm %s", vf.kind)}
		}
		src, tracePath, err := prepareReference(ctx, work, o.Device, memBytes, o.Seed, progress)
		if err != nil {
			return nil, err
		}
		o.Source, o.TracePath = src, tracePath
	default:
		s, err := openSystem(cmd, vf)
		if err != nil {
			return nil, err
		}
		defer s.close()
		if o.Source, err = s.resolve(ctx, snapshot); err != nil {
			return nil, err
		}
		o.TracePath = vf.trace
		if d, ok := s.restorer.VMM.(*qemu.Driver); ok {
			o.VMM, o.QEMU = bench.VMMQEMU, d.Options()
		}
	}
	return bench.Run(ctx, o)
}

// prepareGuest boots, captures and publishes a fresh real guest into a
// repository under dir and records its manifest from the guest's own
// device reads, as warmstart capture with recording enabled does. It
// returns the snapshot and what its agent answered before the capture
// (token and heap digest), which every restored guest must answer again.
func prepareGuest(ctx context.Context, d *qemu.Driver, dir, initramfsCache, agent string, progress io.Writer) (restore.Source, map[string]string, error) {
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		return restore.Source{}, nil, err
	}
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		return restore.Source{}, nil, err
	}
	base := &restore.Restorer{VMM: d, RuntimeDir: run}
	tr, closeTr, err := recorder.TracingRestorerWith(base, filepath.Join(dir, "trace-mnt"), fusedev.Options{AllowWriteOpen: true})
	if err != nil {
		return restore.Source{}, nil, err
	}
	defer closeTr()
	rec := &recorder.Recorder{Repo: repo, Restorer: tr, Device: restore.DeviceFile, Timeout: 5 * time.Minute}
	snap, job, err := capture.Publish(ctx, repo, rec, capture.Options{
		Booter:     &capture.QEMU{Driver: d, Initramfs: initramfs.Options{CacheDir: initramfsCache, Agent: agent}},
		StagingDir: repo.Root(),
		RuntimeDir: run,
		Progress:   progress,
	})
	if err != nil {
		return restore.Source{}, nil, err
	}
	res, err := job.Result()
	if err != nil {
		return restore.Source{}, nil, err
	}
	fmt.Fprintf(progress, "guest snapshot %s captured under %s (boot to agent %v); startup manifest recorded from its device reads and attached: %d ranges, %.1f MiB, sha256 %s\n",
		snap.Record.ID, snap.Accel, snap.Boot.Round(time.Millisecond), res.Ranges, float64(res.Bytes)/(1<<20), res.Descriptor.SHA256[:16])
	resolved, err := repo.Resolve(ctx, snap.Record.ID)
	if err != nil {
		return restore.Source{}, nil, err
	}
	return restore.SourceOf(resolved), snap.Ready.Detail, nil
}

// prepareReference synthesizes the reference snapshot, publishes it into a
// repository under dir and records its manifest on device, as a publish
// with recording enabled would.
func prepareReference(ctx context.Context, dir, device string, memBytes int64, seed uint64, progress io.Writer) (restore.Source, string, error) {
	w, err := openReferenceWorkspace(dir, device)
	if err != nil {
		return restore.Source{}, "", err
	}
	defer w.close()
	fmt.Fprintf(progress, "synthesizing the %d MiB reference snapshot (seed %d) and publishing it\n", memBytes>>20, seed)
	snap, job, err := reference.Publish(ctx, w.repo, w.recorder, reference.Options{Dir: w.refDir, MemoryBytes: memBytes, Seed: seed})
	if err != nil {
		return restore.Source{}, "", err
	}
	res, err := job.Result()
	if err != nil {
		return restore.Source{}, "", err
	}
	fmt.Fprintf(progress, "startup manifest recorded on the %s device and attached: %d ranges, %.1f MiB, sha256 %s\n",
		device, res.Ranges, float64(res.Bytes)/(1<<20), res.Descriptor.SHA256[:16])
	resolved, err := w.repo.Resolve(ctx, snap.ID)
	if err != nil {
		return restore.Source{}, "", err
	}
	return restore.SourceOf(resolved), snap.Paths.Trace, nil
}

// referenceWorkspace is what publishing and restoring the reference
// snapshot under one directory takes: a POSIX repository, a FUSE mount, a
// restorer playing the reference trace, and a recorder on its own tracing
// mount. bench and demo share it.
type referenceWorkspace struct {
	repo     *posixfs.Repo
	refDir   string
	restorer *restore.Restorer
	recorder *recorder.Recorder
	closers  []func() error
}

func openReferenceWorkspace(dir, device string) (*referenceWorkspace, error) {
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		return nil, err
	}
	srv, err := fusedev.Mount(filepath.Join(dir, "mnt"), fusedev.Options{})
	if err != nil {
		return nil, err
	}
	w := &referenceWorkspace{repo: repo, refDir: filepath.Join(dir, "reference"), closers: []func() error{srv.Close}}
	w.restorer = &restore.Restorer{
		FUSE:       srv,
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        &replay.VMM{TracePath: synth.PathsIn(w.refDir).Trace},
		RuntimeDir: filepath.Join(dir, "run"),
	}
	tr, closeTr, err := recorder.TracingRestorer(w.restorer, filepath.Join(dir, "trace-mnt"))
	if err != nil {
		w.close()
		return nil, err
	}
	w.closers = append(w.closers, closeTr)
	w.recorder = &recorder.Recorder{Repo: repo, Restorer: tr, Device: device}
	return w, nil
}

// close unmounts the tracing mount, then the serving one.
func (w *referenceWorkspace) close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
}
