package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"warmstart/internal/s3bench"
)

// s3BenchFlags are the bench flags of --repository s3.
type s3BenchFlags struct {
	repository    string
	latencyMs     int
	bandwidthMbit int64
}

// runS3Bench measures the S3 repository path: it starts a MinIO on
// loopback behind a Toxiproxy link of the given latency and bandwidth,
// publishes the reference snapshot into it, and times restores with an
// empty (cold) and a filled (warm) node cache, prefetch off and on.
func runS3Bench(ctx context.Context, f s3BenchFlags, blocks int, seed uint64, memBytes int64, policy string, out, progress io.Writer, jsonPath string) (err error) {
	work, err := os.MkdirTemp("", "warmstart-s3bench-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, removeWorkDir(work)) }()
	rep, err := s3bench.Run(ctx, s3bench.Options{
		WorkDir: work, MemoryBytes: memBytes, Seed: seed, Blocks: blocks,
		LatencyMs: f.latencyMs, BandwidthBits: f.bandwidthMbit * 1_000_000,
		Policy: policy, Progress: progress,
	})
	if err != nil {
		return err
	}
	rep.WriteTable(out)
	if jsonPath != "" {
		if err := os.WriteFile(jsonPath, rep.JSON(), 0o644); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}
