// Command warmstart-s3bench measures restores from the S3 repository
// (package s3bench): a MinIO on loopback behind a Toxiproxy link of the
// given latency and bandwidth, the reference snapshot published into it,
// restores timed with an empty (cold) and a filled (warm) node cache,
// prefetch off and on. `warmstart bench --repository s3` checks its flags
// and then runs this command in its place.
//
// It is a command of its own, not a verb of warmstart, because what it
// runs is test infrastructure: the MinIO server process and Toxiproxy
// (with its logging and HTTP API libraries) come from the test harness
// internal/lab/miniotest, which imports package testing. Kept here, none of
// that is linked into the warmstart binary operators install, and the
// harness stays the one the S3 tests use, so the benchmark's link is the
// one they test.
//
// Usage:
//
//	warmstart-s3bench [--blocks 8] [--seed 1] [--memory-size 128MiB] [--policy warmstart]
//	                  [--s3-latency-ms 5] [--s3-bandwidth-mbit 1000] [--s3-link-mbit 1000] [--json FILE]
//	                  [--readaround-kib 0] [--prefetch-readaround-kib 0]
//
// It needs root (FUSE) and the minio binary (.ci/minio.sh, or
// WARMSTART_MINIO). SIGINT and SIGTERM stop it as they stop warmstart
// bench: the running trial ends, the mounts, MinIO and the temporary
// directory go, and it exits 130 or 143.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	wsconfig "warmstart/internal/config"
	"warmstart/internal/interrupt"
	localbench "warmstart/internal/lab/bench" // bench is this file's own function
	"warmstart/internal/lab/s3bench"
	"warmstart/internal/layout"
	"warmstart/internal/node"
	"warmstart/internal/reexec"
	"warmstart/internal/restore"
	"warmstart/internal/vmm/replay"
)

// Exit statuses besides 0 and an interrupt's 128 + signal.
const (
	exitFailed = 1
	exitUsage  = 2
)

// roles are the parts this executable plays besides the command itself
// (reexec.Env).
var roles = reexec.Roles{replay.RoleReplayVMM: replay.ChildMain}

func main() {
	// Restores re-execute this binary as the replay VMM.
	roles.Dispatch()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is what the flags ask for.
type config struct {
	opts     s3bench.Options
	jsonPath string
}

// run runs the command with args and returns its exit status.
func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "warmstart: %v\n", err)
		return exitUsage
	}
	c.opts.Progress = stderr
	// From here on a signal stops the run, which then cleans up.
	in := interrupt.Notify(stderr)
	err = in.Result(bench(in.Work, c, stdout))
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "warmstart: %v\n", err)
	var ie interrupt.Error
	if errors.As(err, &ie) {
		return ie.ExitCode()
	}
	return exitFailed
}

// parseFlags reads args, refusing values no run can use.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var (
		c       config
		memSize string
		mbit    int64
		link    int64
		conds   string
		runKiB  int64
	)
	fs := flag.NewFlagSet("warmstart-s3bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.opts.Blocks, "blocks", 8, "blocks of four trials (cold and warm node cache, prefetch off and on)")
	fs.Uint64Var(&c.opts.Seed, "seed", 1, "seed of the reference snapshot and of the frozen random order")
	fs.StringVar(&memSize, "memory-size", "128MiB", "guest memory of the reference snapshot")
	fs.StringVar(&c.opts.Policy, "policy", restore.DefaultPolicy, "device prefetch policy of the prefetch-on trials")
	fs.IntVar(&c.opts.LatencyMs, "s3-latency-ms", s3bench.DefaultLatencyMs, "latency added to every object-store response")
	fs.Int64Var(&mbit, "s3-bandwidth-mbit", s3bench.DefaultBandwidthBits/1_000_000, "bandwidth of each object-store connection")
	fs.Int64Var(&link, "s3-link-mbit", s3bench.DefaultLinkBits/1_000_000, "bandwidth of the node's link: all object-store connections together")
	fs.StringVar(&c.jsonPath, "json", "", "write all raw trials and the summary to this file")
	fs.StringVar(&conds, "conditions", "", "comma-separated conditions each block runs (cold-off,cold-on,warm-off,warm-on; default all)")
	fs.IntVar(&c.opts.Warm.Concurrency, "warm-runs", 0, "cache prefetch GETs in flight (default: the repository's)")
	fs.Int64Var(&runKiB, "warm-run-kib", 0, "cache prefetch bytes per GET, KiB (default: the repository's)")
	fs.Int64Var(&c.opts.ReadaroundKiB, "readaround-kib", 0, "file device readaround of restores without prefetch, KiB ([memory] readaround_kib; default: the backend's)")
	fs.Int64Var(&c.opts.PrefetchReadaroundKiB, "prefetch-readaround-kib", 0, "file device readaround of restores that prefetch, KiB ([memory] prefetch_readaround_kib; default: the built-in one)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if err := localbench.CheckBlocks("blocks", c.opts.Blocks, 1); err != nil {
		return config{}, err
	}
	size, err := layout.ParseSize(memSize)
	if err != nil {
		return config{}, fmt.Errorf("--memory-size: %w", err)
	}
	c.opts.MemoryBytes = size
	if mbit < 1 || link < 1 {
		return config{}, fmt.Errorf("--s3-bandwidth-mbit %d and --s3-link-mbit %d: want at least 1", mbit, link)
	}
	c.opts.BandwidthBits = mbit * 1_000_000
	c.opts.LinkBits = link * 1_000_000
	if c.opts.Warm.Concurrency < 0 || runKiB < 0 {
		return config{}, fmt.Errorf("--warm-runs %d and --warm-run-kib %d: want 0 (the default) or more", c.opts.Warm.Concurrency, runKiB)
	}
	c.opts.Warm.RunCapBytes = runKiB << 10
	if err := checkReadaround(c.opts.ReadaroundKiB, c.opts.PrefetchReadaroundKiB); err != nil {
		return config{}, err
	}
	if conds == "" {
		return c, nil
	}
	for _, name := range strings.Split(conds, ",") {
		cond, err := s3bench.ParseCondition(name)
		if err != nil {
			return config{}, fmt.Errorf("--conditions: %w", err)
		}
		c.opts.Conditions = append(c.opts.Conditions, cond)
	}
	return c, nil
}

// checkReadaround refuses windows the node's configuration would refuse,
// with the same bounds ([memory] in the configuration reference).
func checkReadaround(kib, prefetchKiB int64) error {
	cfg := wsconfig.Default()
	cfg.Memory.ReadaroundKiB = kib
	if prefetchKiB != 0 {
		cfg.Memory.PrefetchReadaroundKiB = prefetchKiB
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--readaround-kib %d, --prefetch-readaround-kib %d: %w", kib, prefetchKiB, err)
	}
	return nil
}

// bench runs the measurement in a temporary directory of its own, which
// it removes whatever happens, and prints the table (and writes the JSON
// report when asked).
func bench(ctx context.Context, c config, out io.Writer) (err error) {
	work, err := os.MkdirTemp("", "warmstart-s3bench-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, node.RemoveWorkDir(work)) }()
	o := c.opts
	o.WorkDir = work
	rep, err := s3bench.Run(ctx, o)
	if err != nil {
		return err
	}
	rep.WriteTable(out)
	if c.jsonPath != "" {
		if err := os.WriteFile(c.jsonPath, rep.JSON(), 0o644); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}
