package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// The S3 benchmark runs a MinIO on loopback behind a Toxiproxy link: test
// infrastructure (internal/lab/miniotest imports package testing, Toxiproxy
// brings zerolog, gorilla/mux and tomb) that the warmstart binary must not
// link. It lives in the companion command warmstart-s3bench
// (cmd/warmstart-s3bench); the bench verb checks its flags and ExecS3
// execs that command in its place, which then prints, cleans up and exits
// (130 or 143 on a signal) exactly as bench does.
const (
	S3Command = "warmstart-s3bench"
	// S3BinaryEnv names the companion binary, overriding the search
	// beside this executable and on PATH.
	S3BinaryEnv = "WARMSTART_S3BENCH_BINARY"
)

// errNoS3Companion says how to get the companion when it is not found.
var errNoS3Companion = errors.New("bench --repository s3 runs the companion command " + S3Command +
	", which holds the MinIO/Toxiproxy harness and is not part of this binary: build it beside warmstart with" +
	" `go build -o DIR ./cmd/warmstart ./cmd/" + S3Command + "` (DIR ending in /), put it on PATH," +
	" or set " + S3BinaryEnv + " to it")

// S3Options are the S3 benchmark's parameters, passed on to the companion.
type S3Options struct {
	Blocks        int
	Seed          uint64
	MemBytes      int64
	Policy        string
	JSONPath      string
	LatencyMs     int
	BandwidthMbit int64
	LinkMbit      int64
	// ReadaroundKiB and PrefetchReadaroundKiB are the operator's [memory]
	// readaround windows, as the configuration gives them (0: the default).
	ReadaroundKiB, PrefetchReadaroundKiB int64
}

// args are the companion's arguments for o.
func (o S3Options) args() []string {
	return []string{
		"--blocks", strconv.Itoa(o.Blocks),
		"--seed", strconv.FormatUint(o.Seed, 10),
		"--memory-size", strconv.FormatInt(o.MemBytes, 10),
		"--policy", o.Policy,
		"--s3-latency-ms", strconv.Itoa(o.LatencyMs),
		"--s3-bandwidth-mbit", strconv.FormatInt(o.BandwidthMbit, 10),
		"--s3-link-mbit", strconv.FormatInt(o.LinkMbit, 10),
		"--readaround-kib", strconv.FormatInt(o.ReadaroundKiB, 10),
		"--prefetch-readaround-kib", strconv.FormatInt(o.PrefetchReadaroundKiB, 10),
		"--json", o.JSONPath,
	}
}

// ExecS3 measures the S3 repository path by replacing this process
// with the companion command: it starts a MinIO on loopback behind a
// Toxiproxy link of the given latency and bandwidth, publishes the
// reference snapshot into it, and times restores with an empty (cold) and
// a filled (warm) node cache, prefetch off and on. It returns only if the
// companion cannot be found or started.
func ExecS3(o S3Options) error {
	bin, err := findS3Companion()
	if err != nil {
		return err
	}
	argv := append([]string{bin}, o.args()...)
	// exec, not a child: the companion gets this process's id, standard
	// streams and signals, so an operator's Ctrl-C reaches the process
	// that cleans up, and its exit status is bench's.
	if err := syscall.Exec(bin, argv, os.Environ()); err != nil {
		return fmt.Errorf("bench --repository s3: exec %s: %w", bin, err)
	}
	return nil // not reached
}

// findS3Companion returns the companion binary: $WARMSTART_S3BENCH_BINARY,
// else warmstart-s3bench beside this executable, else on PATH.
func findS3Companion() (string, error) {
	if p := os.Getenv(S3BinaryEnv); p != "" {
		if !isExecutableFile(p) {
			return "", fmt.Errorf("%s=%s is not an executable file: %w", S3BinaryEnv, p, errNoS3Companion)
		}
		return filepath.Abs(p)
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), S3Command); isExecutableFile(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(S3Command); err == nil {
		return filepath.Abs(p)
	}
	return "", errNoS3Companion
}

func isExecutableFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
