package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// s3BenchFlags are the bench flags of --repository s3.
type s3BenchFlags struct {
	repository    string
	latencyMs     int
	bandwidthMbit int64
	linkMbit      int64
}

// The S3 benchmark runs a MinIO on loopback behind a Toxiproxy link: test
// infrastructure (internal/miniotest imports package testing, Toxiproxy
// brings zerolog, gorilla/mux and tomb) that the warmstart binary must not
// link. It lives in the companion command warmstart-s3bench
// (cmd/warmstart-s3bench); bench --repository s3 checks its flags and
// execs that command in its place, which then prints, cleans up and exits
// (130 or 143 on a signal) exactly as bench does.
const (
	s3BenchCommand = "warmstart-s3bench"
	// s3BenchBinaryEnv names the companion binary, overriding the search
	// beside this executable and on PATH.
	s3BenchBinaryEnv = "WARMSTART_S3BENCH_BINARY"
)

// errNoS3Bench says how to get the companion when it is not found.
var errNoS3Bench = errors.New("bench --repository s3 runs the companion command " + s3BenchCommand +
	", which holds the MinIO/Toxiproxy harness and is not part of this binary: build it beside warmstart with" +
	" `go build -o DIR ./cmd/warmstart ./cmd/" + s3BenchCommand + "` (DIR ending in /), put it on PATH," +
	" or set " + s3BenchBinaryEnv + " to it")

// runS3Bench measures the S3 repository path by replacing this process
// with the companion command: it starts a MinIO on loopback behind a
// Toxiproxy link of the given latency and bandwidth, publishes the
// reference snapshot into it, and times restores with an empty (cold) and
// a filled (warm) node cache, prefetch off and on. It returns only if the
// companion cannot be found or started.
func runS3Bench(f s3BenchFlags, blocks int, seed uint64, memBytes int64, policy, jsonPath string) error {
	bin, err := findS3Bench()
	if err != nil {
		return err
	}
	argv := []string{bin,
		"--blocks", strconv.Itoa(blocks),
		"--seed", strconv.FormatUint(seed, 10),
		"--memory-size", strconv.FormatInt(memBytes, 10),
		"--policy", policy,
		"--s3-latency-ms", strconv.Itoa(f.latencyMs),
		"--s3-bandwidth-mbit", strconv.FormatInt(f.bandwidthMbit, 10),
		"--s3-link-mbit", strconv.FormatInt(f.linkMbit, 10),
		"--json", jsonPath,
	}
	// exec, not a child: the companion gets this process's id, standard
	// streams and signals, so an operator's Ctrl-C reaches the process
	// that cleans up, and its exit status is bench's.
	if err := syscall.Exec(bin, argv, os.Environ()); err != nil {
		return fmt.Errorf("bench --repository s3: exec %s: %w", bin, err)
	}
	return nil // not reached
}

// findS3Bench returns the companion binary: $WARMSTART_S3BENCH_BINARY,
// else warmstart-s3bench beside this executable, else on PATH.
func findS3Bench() (string, error) {
	if p := os.Getenv(s3BenchBinaryEnv); p != "" {
		if !isExecutableFile(p) {
			return "", fmt.Errorf("%s=%s is not an executable file: %w", s3BenchBinaryEnv, p, errNoS3Bench)
		}
		return filepath.Abs(p)
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), s3BenchCommand); isExecutableFile(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(s3BenchCommand); err == nil {
		return filepath.Abs(p)
	}
	return "", errNoS3Bench
}

func isExecutableFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
