package qemu

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-10-amd64"},
		{"vmlinuz-5.10.0-28-amd64", "vmlinuz-6.1.0-1-amd64"},
		{"vmlinuz-6.1.0-57-amd64", "vmlinuz-6.12.0-1-amd64"},
		{"vmlinuz-6.1", "vmlinuz-6.1.1"},
		{"vmlinuz-6.01", "vmlinuz-6.2"},
	} {
		if c := compareVersions(tc.a, tc.b); c >= 0 {
			t.Errorf("compareVersions(%q, %q) = %d, want < 0", tc.a, tc.b, c)
		}
		if c := compareVersions(tc.b, tc.a); c <= 0 {
			t.Errorf("compareVersions(%q, %q) = %d, want > 0", tc.b, tc.a, c)
		}
	}
	if c := compareVersions("vmlinuz-6.1.0", "vmlinuz-6.1.0"); c != 0 {
		t.Errorf("equal names compare %d", c)
	}
}

func TestNewestKernel(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-10-amd64", "vmlinuz-5.10.0-30-amd64"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := newestKernel(filepath.Join(dir, "vmlinuz-*"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "vmlinuz-6.1.0-10-amd64"); got != want {
		t.Errorf("newest kernel %s, want %s", got, want)
	}
	if _, err := newestKernel(filepath.Join(t.TempDir(), "vmlinuz-*")); !errors.Is(err, ErrNoKernel) {
		t.Errorf("empty directory: %v, want ErrNoKernel", err)
	}
}

// TestShellQuote runs quoted paths through /bin/sh, as QEMU's exec:
// migration does.
func TestShellQuote(t *testing.T) {
	for _, s := range []string{"/tmp/plain", "/tmp/with space", "/tmp/it's", `/tmp/$(x)"y"\z`, "/tmp/a;b|c&d"} {
		out, err := exec.Command("/bin/sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != s {
			t.Errorf("sh read %q back as %q", s, out)
		}
	}
}

func TestOptionValue(t *testing.T) {
	if got := optionValue("/a,b/c"); got != "/a,,b/c" {
		t.Errorf("optionValue = %q", got)
	}
}

func TestParsePong(t *testing.T) {
	p, ok := parsePong("PONG n-1 0123abcd 4567 00ff00ff00ff00ff")
	if !ok || p.nonce != "n-1" || p.token != "0123abcd" || p.uptime != 4567*time.Millisecond || p.digest != "00ff00ff00ff00ff" {
		t.Errorf("parsePong = %+v, %v", p, ok)
	}
	p, ok = parsePong("PONG n-1 0123abcd 4567 00ff00ff00ff00ff 0a0b host")
	if !ok || p.digest != "00ff00ff00ff00ff" || p.random != "0a0b" || p.reseed != "host" {
		t.Errorf("parsePong with random bytes and reseed = %+v, %v", p, ok)
	}
	// The answer of an agent without the digest.
	p, ok = parsePong("PONG n-1 0123abcd 4567")
	if !ok || p.nonce != "n-1" || p.token != "0123abcd" || p.uptime != 4567*time.Millisecond || p.digest != "" {
		t.Errorf("parsePong without a digest = %+v, %v", p, ok)
	}
	for _, bad := range []string{"PONG n-1 tok", "PONG n-1 tok -5", "PONG n-1 tok x", "PING n-1", "PONG a b c d", "[ 0.1] PONG n t 1", "PONG n t 1 d extra"} {
		if _, ok := parsePong(bad); ok {
			t.Errorf("parsePong accepted %q", bad)
		}
	}
}

func TestReadTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	content := "+ qemu -M microvm\n" + strings.Repeat("x", 100) + "\nfirst error\nsecond error\n"
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readTail(p, 1024); got != strings.Repeat("x", 100)+" | first error | second error" {
		t.Errorf("whole tail %q", got)
	}
	if got := readTail(p, 20); got != "second error" {
		t.Errorf("cut tail %q", got)
	}
	if got := readTail(filepath.Join(t.TempDir(), "none"), 10); got != "" {
		t.Errorf("missing log gave %q", got)
	}
}

// socketPair returns two connected stream sockets, buffered like the
// serial console's Unix socket.
func socketPair(t *testing.T) (host, guest net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	t.Cleanup(func() { conns[0].Close(); conns[1].Close() })
	return conns[0], conns[1]
}

// fakeGuest answers pings on conn the way the agent does, after writing
// console noise and a stale answer, and signals each ping it reads.
func fakeGuest(conn net.Conn, token string, pings chan<- string) {
	conn.Write([]byte("[    0.1] kernel noise\nPONG stale-1 " + token + " 5\nwarmstart-agent: started\n"))
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || f[0] != "PING" {
			continue
		}
		if pings != nil {
			pings <- f[1]
		}
		conn.Write([]byte("PONG " + f[1] + " " + token + " 42 feed\n"))
	}
}

func TestPingIgnoresNoiseAndStaleAnswers(t *testing.T) {
	host, guest := socketPair(t)
	go fakeGuest(guest, "tok", nil)
	a := newAgentConn(host, true)
	defer a.close()
	p, err := a.ping(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.token != "tok" || p.uptime != 42*time.Millisecond || p.digest != "feed" || !strings.HasPrefix(p.nonce, a.prefix+"-") {
		t.Errorf("ping answered %+v", p)
	}
	lines := a.recentLines()
	if len(lines) != 2 || lines[0] != "[    0.1] kernel noise" || lines[1] != "warmstart-agent: started" {
		t.Errorf("console lines kept: %q", lines)
	}
}

// TestPingRetriesUntilAnswered: a guest that only starts answering later
// is pinged again and its answer to any ping of this call counts.
func TestPingRetriesUntilAnswered(t *testing.T) {
	host, guest := socketPair(t)
	a := newAgentConn(host, true)
	defer a.close()
	// The guest reads two pings without answering, then answers.
	go func() {
		sc := bufio.NewScanner(guest)
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 || f[0] != "PING" {
				continue
			}
			if n++; n > 2 {
				guest.Write([]byte("PONG " + f[1] + " late 7\n"))
			}
		}
	}()
	p, err := a.ping(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.token != "late" {
		t.Errorf("ping answered %+v", p)
	}
}

// TestPingCarriesFreshHostEntropy: every ping is preceded, in the same
// write, by a SEED line of fresh host entropy for the guest's RNG, unless
// the connection was made without seeds.
func TestPingCarriesFreshHostEntropy(t *testing.T) {
	for _, seeds := range []bool{true, false} {
		host, guest := socketPair(t)
		a := newAgentConn(host, seeds)
		got := make(chan []string, 1)
		go func() {
			sc := bufio.NewScanner(guest)
			var seen []string
			for sc.Scan() {
				line := sc.Text()
				if line == "" {
					continue
				}
				seen = append(seen, line)
				// Unanswered, the first pings are sent again.
				if f := strings.Fields(line); len(f) == 2 && f[0] == "PING" && len(seen) >= 4 {
					select {
					case got <- seen:
					default:
					}
					guest.Write([]byte("PONG " + f[1] + " tok 1\n"))
				}
			}
		}()
		if _, err := a.ping(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		a.close()
		lines := <-got
		var seedsSeen []string
		for i, line := range lines {
			f := strings.Fields(line)
			switch {
			case f[0] == "SEED":
				if !seeds {
					t.Fatalf("a connection without seeds sent %q", line)
				}
				if len(f) != 2 || len(f[1]) != 2*seedBytes || i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "PING ") {
					t.Fatalf("seed line %q is not 32 bytes of hex right before a ping: %q", line, lines)
				}
				seedsSeen = append(seedsSeen, f[1])
			case f[0] == "PING":
				if seeds && (i == 0 || !strings.HasPrefix(lines[i-1], "SEED ")) {
					t.Fatalf("ping %q came without a seed: %q", line, lines)
				}
			}
		}
		if seeds && (len(seedsSeen) < 2 || seedsSeen[0] == seedsSeen[1]) {
			t.Errorf("seeds %q: want a fresh one with each ping", seedsSeen)
		}
	}
}

func TestPingEnds(t *testing.T) {
	t.Run("qemu exited", func(t *testing.T) {
		host, _ := socketPair(t)
		a := newAgentConn(host, true)
		defer a.close()
		exited := make(chan struct{})
		close(exited)
		if _, err := a.ping(context.Background(), exited); !errors.Is(err, ErrExited) {
			t.Fatalf("ping on an exited QEMU returned %v", err)
		}
	})
	t.Run("context", func(t *testing.T) {
		host, _ := socketPair(t)
		a := newAgentConn(host, true)
		defer a.close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := a.ping(ctx, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("ping with a cancelled context returned %v", err)
		}
	})
	t.Run("console closed", func(t *testing.T) {
		host, guest := socketPair(t)
		a := newAgentConn(host, true)
		defer a.close()
		guest.Close()
		if _, err := a.ping(context.Background(), nil); err == nil {
			t.Fatal("ping on a closed console succeeded")
		}
	})
}
