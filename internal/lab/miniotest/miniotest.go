// Package miniotest runs a real MinIO server for tests: on 127.0.0.1, with
// a private data directory, started and stopped by the test process (and
// restartable on the same address and data, for tests that take the store
// away in the middle of a restore). It also puts Toxiproxy, as a library,
// between a client and the server to add latency, limit bandwidth and reset
// connections (toxiproxy.go).
//
// The MinIO binary is built from the Go module proxy by .ci/minio.sh; Find
// looks for it in $WARMSTART_MINIO, in that script's cache directory and on
// PATH. Tests skip, saying how to install it, when it is missing.
package miniotest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sys/unix"
)

// Credentials of every server this package starts.
const (
	AccessKey = "warmstart"
	SecretKey = "warmstart-test-secret"
)

// BinaryEnv names the MinIO binary to use, overriding the search.
const BinaryEnv = "WARMSTART_MINIO"

// InstallHint says how to get the binary.
const InstallHint = "MinIO is not installed: run .ci/minio.sh (it builds github.com/minio/minio " +
	"into ~/.cache/warmstart/bin, about 2 minutes) or set " + BinaryEnv + " to a minio binary"

// ErrNotInstalled is returned by Find when no binary is found.
var ErrNotInstalled = errors.New(InstallHint)

const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
)

// Find returns the path of the MinIO binary.
func Find() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%s=%s is not an executable file: %w", BinaryEnv, p, ErrNotInstalled)
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache")
		}
	}
	if cache != "" {
		if p := filepath.Join(cache, "warmstart", "bin", "minio"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p, nil
	}
	return "", ErrNotInstalled
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Server is one MinIO server process.
type Server struct {
	// Endpoint is host:port of the S3 API.
	Endpoint string
	binary   string
	dataDir  string
	logPath  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// Launch starts a server storing its data in dataDir (created if needed)
// and waits until it is ready. The caller must Stop it.
func Launch(dataDir string) (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("minio: %w", err)
	}
	s := &Server{
		Endpoint: fmt.Sprintf("127.0.0.1:%d", port),
		binary:   bin,
		dataDir:  filepath.Join(dataDir, "data"),
		logPath:  filepath.Join(dataDir, "minio.log"),
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// YieldCPU lowers the running server's CPU priority to the lowest (nice
// 19), every thread of it: it then runs on what the processes beside it
// leave idle. A benchmark of a node restoring from an object store runs
// the store on the node's own cores, where a real store takes none of
// them; at the lowest priority it still serves every request, as slowly
// as the idle cores let it, but no longer slows the node it serves.
func (s *Server) YieldCPU() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.stopped {
		return errors.New("minio: not running")
	}
	// The server leads a process group of its own (Setpgid): PRIO_PGRP
	// reaches every thread, where PRIO_PROCESS would reach one.
	if err := unix.Setpriority(unix.PRIO_PGRP, s.cmd.Process.Pid, 19); err != nil {
		return fmt.Errorf("minio: lower priority: %w", err)
	}
	return nil
}

// Require skips t when MinIO is not installed, or fails it when the
// environment says CI=true: CI installs MinIO (.ci/run), so there a missing
// binary is a broken machine, not a developer's laptop.
func Require(t testing.TB) {
	t.Helper()
	if _, err := Find(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// Start runs the server t needs for its whole length (see Require when
// MinIO is not installed).
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	s, err := Launch(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// Start (re)starts a stopped server on its address and data directory and
// waits until it answers.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && !s.stopped {
		return fmt.Errorf("minio %s: already running", s.Endpoint)
	}
	if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
		return fmt.Errorf("minio: %w", err)
	}
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("minio: %w", err)
	}
	consolePort, err := freePort()
	if err != nil {
		logf.Close()
		return fmt.Errorf("minio: %w", err)
	}
	cmd := exec.Command(s.binary, "server", "--quiet",
		"--address", s.Endpoint,
		"--console-address", fmt.Sprintf("127.0.0.1:%d", consolePort),
		s.dataDir)
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+AccessKey,
		"MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server must not outlive the test process, even one killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("minio: start %s: %w", s.binary, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(exited)
	}()
	s.cmd, s.exited, s.stopped = cmd, exited, false
	if err := waitReady(s.Endpoint, exited); err != nil {
		s.stopLocked()
		return fmt.Errorf("minio %s: %w (log %s)", s.Endpoint, err, s.logPath)
	}
	return nil
}

// waitReady polls the health endpoint until the server answers 200.
func waitReady(endpoint string, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get("http://" + endpoint + "/minio/health/ready")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", readyTimeout)
		}
	}
}

// Stop stops the server (SIGTERM, then SIGKILL) and waits for it to exit.
// Its data stays for Start. Safe to call again.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

func (s *Server) stopLocked() error {
	if s.cmd == nil || s.stopped {
		return nil
	}
	s.stopped = true
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	return nil
}

// Client returns a minio-go client of the server at endpoint (the server's
// own, or a proxy's in front of it).
func Client(endpoint string) (*minio.Client, error) {
	return minio.New(endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(AccessKey, SecretKey, ""),
		BucketLookup: minio.BucketLookupPath,
		Region:       "us-east-1",
	})
}

// MakeBucket creates bucket on the server.
func (s *Server) MakeBucket(ctx context.Context, bucket string) error {
	c, err := Client(s.Endpoint)
	if err != nil {
		return err
	}
	if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		return fmt.Errorf("make bucket %s: %w", bucket, err)
	}
	return nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
