package s3bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/reexec"
)

// RoleLink is the role of the link process: the Toxiproxy (latency and a
// bandwidth per connection) and, in front of it, the link that caps all
// connections together (miniotest.Link). It runs in a process of its own,
// not in the node's, so that its CPU time is accounted apart from the
// node's (cpu.go): shaping a 1 Gbit/s stream in user space costs tens of
// milliseconds per restore, which a real node's network does not charge
// it. The executable that runs the benchmark must dispatch this role.
const RoleLink = "s3bench-link"

// linkProcess is a running link process. It is driven over its standard
// streams: it prints the address clients connect to, then answers each
// command line ("latency MS", "bandwidth BITS", "rate BITS") with "ok" or
// "error: ..."; it exits when its standard input closes.
type linkProcess struct {
	Addr string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
}

// startLink starts this executable as a link process forwarding to
// upstream.
func startLink(upstream string) (*linkProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("link process: %w", err)
	}
	cmd := exec.Command(exe, upstream)
	cmd.Env = reexec.Environ(os.Environ(), RoleLink)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("link process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("link process: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("link process: %w", err)
	}
	l := &linkProcess{cmd: cmd, in: in, out: bufio.NewReader(stdout)}
	addr, err := l.out.ReadString('\n')
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("link process: no address: %w", err)
	}
	l.Addr = strings.TrimSpace(addr)
	return l, nil
}

// PID is the link process's id.
func (l *linkProcess) PID() int { return l.cmd.Process.Pid }

// set sends one command and waits for its answer.
func (l *linkProcess) set(what string, value int64) error {
	if _, err := fmt.Fprintf(l.in, "%s %d\n", what, value); err != nil {
		return fmt.Errorf("link process: %s: %w", what, err)
	}
	answer, err := l.out.ReadString('\n')
	if err != nil {
		return fmt.Errorf("link process: %s: %w", what, err)
	}
	if answer = strings.TrimSpace(answer); answer != "ok" {
		return fmt.Errorf("link process: %s %d: %s", what, value, answer)
	}
	return nil
}

// Close ends the link process and waits for it.
func (l *linkProcess) Close() {
	l.in.Close()
	l.cmd.Wait()
}

// LinkMain is the link process's entry point (RoleLink): its one argument
// is the upstream address.
func LinkMain() int {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "link process: want one argument, the upstream address")
		return 2
	}
	proxy, err := miniotest.NewProxy(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "link process:", err)
		return 1
	}
	defer proxy.Close()
	link, err := miniotest.NewLink(proxy.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "link process:", err)
		return 1
	}
	defer link.Close()
	fmt.Println(link.Addr)
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		if err := linkCommand(proxy, link, lines.Text()); err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println("ok")
	}
	return 0
}

// linkCommand applies one command line to the proxy or the link.
func linkCommand(proxy *miniotest.Proxy, link *miniotest.Link, line string) error {
	what, arg, _ := strings.Cut(line, " ")
	v, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		return fmt.Errorf("%q: %w", line, err)
	}
	switch what {
	case "latency":
		return proxy.Latency(int(v))
	case "bandwidth":
		return proxy.Bandwidth(v)
	case "rate":
		link.SetRate(v)
		return nil
	}
	return errors.New("unknown command " + strconv.Quote(what))
}
