package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseAgentAddress(t *testing.T) {
	for _, c := range []struct {
		in   string
		kind agentKind
		ok   bool
	}{
		{"http://169.254.0.21:49983/health", agentHTTP, true},
		{"https://agent.example/health", agentHTTP, true},
		{"http:///health", 0, false},
		{"unix:/run/agent.sock", agentUnix, true},
		{"unix:agent.sock", agentUnix, true},
		{"unix:", 0, false},
		{"vsock:49983", agentVsock, true},
		{"vsock:-1", 0, false},
		{"vsock:99999999999", 0, false},
		{"169.254.0.21:49983", 0, false},
	} {
		addr, err := parseAgentAddress(c.in)
		if (err == nil) != c.ok || c.ok && addr.kind != c.kind {
			t.Errorf("parseAgentAddress(%q) = %+v, %v", c.in, addr, err)
		}
	}
}

// agentAt builds a probe of address for runtimeDir.
func agentAt(t *testing.T, address, runtimeDir string, probeTimeout time.Duration) *agentProbe {
	t.Helper()
	addr, err := parseAgentAddress(address)
	if err != nil {
		t.Fatal(err)
	}
	return newAgentProbe(addr, runtimeDir, probeTimeout)
}

func TestWaitForAgentPollsUntil2xx(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "up 12ms")
	}))
	defer srv.Close()
	p := agentAt(t, srv.URL+"/health", t.TempDir(), time.Second)
	answer, err := waitForAgent(testContext(t), p, time.Millisecond, 10*time.Second, nil)
	if err != nil || answer != "up 12ms" || calls.Load() != 3 {
		t.Fatalf("answer %q, err %v after %d probes", answer, err, calls.Load())
	}
}

func TestEachProbeHasItsOwnDeadline(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-r.Context().Done() // a lost answer: only the probe's deadline ends it
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()
	p := agentAt(t, srv.URL, t.TempDir(), 100*time.Millisecond)
	answer, err := waitForAgent(testContext(t), p, time.Millisecond, 10*time.Second, nil)
	// Under load a later probe may time out as well; what matters is that
	// the hung one did not hold up the rest.
	if err != nil || answer != "ok" || calls.Load() < 2 {
		t.Fatalf("answer %q, err %v after %d probes", answer, err, calls.Load())
	}
}

func TestWaitForAgentTimesOut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	p := agentAt(t, srv.URL, t.TempDir(), time.Second)
	_, err := waitForAgent(testContext(t), p, time.Millisecond, 300*time.Millisecond, nil)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err %v, want ErrNotReady with the last probe's status", err)
	}

	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	if _, err := waitForAgent(ctx, p, time.Millisecond, time.Hour, nil); !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotReady) {
		t.Fatalf("canceled: %v", err)
	}

	exited := make(chan struct{})
	close(exited)
	if _, err := waitForAgent(testContext(t), p, time.Millisecond, time.Hour, exited); !errors.Is(err, errVMExited) {
		t.Fatalf("exited: %v", err)
	}
}

// serveAgent serves a health endpoint on l until the test ends.
func serveAgent(t *testing.T, l net.Listener, answer string) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != agentHealthPath {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, answer)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
}

func TestProbeUnixSocket(t *testing.T) {
	runtimeDir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(runtimeDir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	serveAgent(t, l, "unix ok")
	for _, addr := range []string{"unix:agent.sock", "unix:" + filepath.Join(runtimeDir, "agent.sock")} {
		answer, err := agentAt(t, addr, runtimeDir, time.Second).probe(testContext(t))
		if err != nil || answer != "unix ok" {
			t.Errorf("%s: answer %q, err %v", addr, answer, err)
		}
	}
}

// vsockMux plays Firecracker's host side of a vsock device: it accepts
// "CONNECT <port>" on the Unix socket and hands out the connection to
// the guest's listener on that port.
type vsockMux struct {
	net.Listener
	port   uint32
	answer string
}

func (m vsockMux) Accept() (net.Conn, error) {
	for {
		conn, err := m.Listener.Accept()
		if err != nil {
			return nil, err
		}
		line, err := readLine(conn)
		if err == nil && line == fmt.Sprintf("CONNECT %d", m.port) {
			if _, err := fmt.Fprintf(conn, "%s\n", m.answer); err == nil && strings.HasPrefix(m.answer, "OK ") {
				return conn, nil
			}
		}
		conn.Close()
	}
}

func TestProbeVsock(t *testing.T) {
	for _, c := range []struct {
		name, answer string
		ok           bool
	}{
		{"accepted", "OK 1073741824", true},
		{"refused", "NOPE", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			runtimeDir := t.TempDir()
			l, err := net.Listen("unix", filepath.Join(runtimeDir, VsockSocketName))
			if err != nil {
				t.Fatal(err)
			}
			serveAgent(t, vsockMux{Listener: l, port: 49983, answer: c.answer}, "vsock ok")
			answer, err := agentAt(t, "vsock:49983", runtimeDir, time.Second).probe(testContext(t))
			if c.ok && (err != nil || answer != "vsock ok") || !c.ok && err == nil {
				t.Fatalf("answer %q, err %v", answer, err)
			}
		})
	}
}
