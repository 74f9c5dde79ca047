package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	// agentHealthPath is what the unix: and vsock: forms ask for.
	agentHealthPath = "/health"
	// agentAnswerLimitBytes caps the health answer kept in ReadyInfo.
	agentAnswerLimitBytes = 4096
	// vsockAnswerLimitBytes bounds Firecracker's "OK <port>" line.
	vsockAnswerLimitBytes = 64
)

type agentKind int

const (
	agentHTTP agentKind = iota
	agentUnix
	agentVsock
)

// agentAddress is a parsed Options.EnvdAddress.
type agentAddress struct {
	kind agentKind
	url  string // agentHTTP
	path string // agentUnix, maybe relative to the runtime directory
	port uint32 // agentVsock
}

func parseAgentAddress(s string) (agentAddress, error) {
	switch {
	case strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://"):
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return agentAddress{}, fmt.Errorf("%q is not a usable URL", s)
		}
		return agentAddress{kind: agentHTTP, url: s}, nil
	case strings.HasPrefix(s, "unix:"):
		p := strings.TrimPrefix(s, "unix:")
		if p == "" {
			return agentAddress{}, fmt.Errorf("%q names no socket", s)
		}
		return agentAddress{kind: agentUnix, path: p}, nil
	case strings.HasPrefix(s, "vsock:"):
		port, err := strconv.ParseUint(strings.TrimPrefix(s, "vsock:"), 10, 32)
		if err != nil {
			return agentAddress{}, fmt.Errorf("%q: vsock port: %v", s, err)
		}
		return agentAddress{kind: agentVsock, port: uint32(port)}, nil
	default:
		return agentAddress{}, fmt.Errorf("%q is not http://…, unix:PATH or vsock:PORT", s)
	}
}

// agentProbe asks one instance's guest agent whether it is up.
type agentProbe struct {
	url     string
	client  *http.Client
	timeout time.Duration
}

// newAgentProbe builds the probe of addr for the instance whose runtime
// directory is runtimeDir.
func newAgentProbe(addr agentAddress, runtimeDir string, timeout time.Duration) *agentProbe {
	// Every probe opens a fresh connection: one that broke while the guest
	// was paused or restoring must not make a later probe fail.
	transport := &http.Transport{DisableKeepAlives: true}
	target := "http://agent" + agentHealthPath
	switch addr.kind {
	case agentHTTP:
		target = addr.url
	case agentUnix:
		path := addr.path
		if !filepath.IsAbs(path) {
			path = filepath.Join(runtimeDir, path)
		}
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	case agentVsock:
		socket := filepath.Join(runtimeDir, VsockSocketName)
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialVsock(ctx, socket, addr.port)
		}
	}
	return &agentProbe{url: target, client: &http.Client{Transport: transport}, timeout: timeout}
}

// dialVsock connects to a guest port through Firecracker's host-side vsock
// socket: the host writes "CONNECT <port>\n" and Firecracker answers
// "OK <host port>\n" once the guest accepted.
func dialVsock(ctx context.Context, socket string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		conn.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: %w", port, err)
	}
	line, err := readLine(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: %w", port, err)
	}
	if !strings.HasPrefix(line, "OK ") {
		conn.Close()
		return nil, fmt.Errorf("vsock CONNECT %d: answer %q", port, line)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// readLine reads up to a newline, one byte at a time, so that nothing
// after it is consumed.
func readLine(r io.Reader) (string, error) {
	var sb strings.Builder
	var b [1]byte
	for sb.Len() < vsockAnswerLimitBytes {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return sb.String(), err
		}
		if b[0] == '\n' {
			return sb.String(), nil
		}
		sb.WriteByte(b[0])
	}
	return sb.String(), fmt.Errorf("answer longer than %d bytes", vsockAnswerLimitBytes)
}

// probe makes one health request with its own deadline. It returns the
// answer's body when the agent answered 2xx.
func (p *agentProbe) probe(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return "", err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, agentAnswerLimitBytes))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("agent answered %s", resp.Status)
	}
	return strings.TrimSpace(string(body)), nil
}

// errVMExited is waitForAgent's answer when the VM is gone.
var errVMExited = errors.New("VM exited")

// waitForAgent probes every interval until the agent answers 2xx (its
// answer is returned), exited closes (errVMExited), timeout passes
// (ErrNotReady with the last probe's error) or ctx ends.
func waitForAgent(ctx context.Context, p *agentProbe, interval, timeout time.Duration, exited <-chan struct{}) (string, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrNotReady)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var lastErr error
	for {
		select {
		case <-exited:
			return "", errVMExited
		default:
		}
		answer, err := p.probe(ctx)
		if err == nil {
			return answer, nil
		}
		if ctx.Err() == nil || lastErr == nil {
			// A probe cut short by the overall deadline says less than
			// the one before it.
			lastErr = err
		}
		select {
		case <-exited:
			return "", errVMExited
		case <-ctx.Done():
			return "", fmt.Errorf("%w (last probe: %v)", context.Cause(ctx), lastErr)
		case <-tick.C:
		}
	}
}
