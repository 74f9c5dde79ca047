package main

import "warmstart/internal/bench"

// s3BenchFlags are the bench flags of --repository s3.
type s3BenchFlags struct {
	latencyMs     int
	bandwidthMbit int64
	linkMbit      int64
}

// The companion command of bench --repository s3 (see bench.ExecS3).
const (
	s3BenchCommand   = bench.S3Command
	s3BenchBinaryEnv = bench.S3BinaryEnv
)
