package api

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenUnix is a Unix socket at a fresh path; its listener is closed
// when t ends.
func listenUnix(t *testing.T) (net.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ws.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, path
}

// TestReadOnlyRequestToAStoppedDaemonEnds: a daemon stopped (SIGSTOP) or
// wedged still has its socket, and the kernel completes every connect
// into its backlog, so a client waits for an answer that never comes. A
// listener that never accepts is exactly that. `restores list` and the
// other read-only requests must end, saying the daemon did not answer.
func TestReadOnlyRequestToAStoppedDaemonEnds(t *testing.T) {
	_, path := listenUnix(t)
	defer func(d time.Duration) { readAnswerTimeout = d }(readAnswerTimeout)
	readAnswerTimeout = 200 * time.Millisecond
	c := NewClient(path)
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.Restores(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "did not answer") || !strings.Contains(err.Error(), path) {
			t.Errorf("GET /restores of a daemon that never answers: %v; want an error saying the daemon at %s did not answer", err, path)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("GET /restores of a daemon that never answers still waits after 30 s")
	}
}

// TestDaemonThatDiesMidRequestIsNamed: a daemon that exits (kill -9)
// while a request is in flight closes the connection; the error says so
// and that the change may have happened, not a bare "EOF".
func TestDaemonThatDiesMidRequestIsNamed(t *testing.T) {
	ln, path := listenUnix(t)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 4096)
		conn.Read(buf) // the request arrives; the daemon dies before it answers
		conn.Close()
	}()
	c := NewClient(path)
	defer c.Close()
	_, err := c.DeleteSnapshot(context.Background(), "ref")
	if err == nil || !strings.Contains(err.Error(), "closed the connection") || !strings.Contains(err.Error(), path) {
		t.Errorf("DELETE of a daemon that died mid-request: %v; want an error saying the daemon at %s closed the connection", err, path)
	}
}
