package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"warmstart/internal/initramfs"
)

func TestParsePing(t *testing.T) {
	long := strings.Repeat("a", maxNonceBytes)
	for _, tc := range []struct {
		line  string
		nonce string
		ok    bool
	}{
		{"PING abc\n", "abc", true},
		{"PING a-b_C9\r\n", "a-b_C9", true},
		{"PING " + long + "\n", long, true},
		{"PING " + long + "x\n", "", false},
		{"PING \n", "", false},
		{"PING\n", "", false},
		{"PING a b\n", "", false},
		{"PING a/b\n", "", false},
		{"ping abc\n", "", false},
		{"xPING abc\n", "", false},
		{"PONG abc tok 1\n", "", false},
		{"\x00\xff\n", "", false},
	} {
		nonce, ok := parsePing([]byte(tc.line))
		if nonce != tc.nonce || ok != tc.ok {
			t.Errorf("parsePing(%q) = %q, %v; want %q, %v", tc.line, nonce, ok, tc.nonce, tc.ok)
		}
	}
}

// testResponder answers with token "tok123", uptime 1234 ms and the
// random bytes r1, r2, ... and digests d1, d2, ... of successive resumes,
// and records the nonce series each resume ran for.
type testResponder struct {
	*responder
	series  string   // set by the test before each new series
	resumes []string // the series each resume ran for
}

func newTestResponder(t *testing.T) *testResponder {
	tr := &testResponder{}
	n := 0
	tr.responder = &responder{
		token:  "tok123",
		uptime: func() time.Duration { return 1234567 * time.Microsecond },
		logf:   t.Logf,
		reseed: func([]byte) error { return errors.New("the host sent no seed") },
		draw: func() (string, error) {
			n++
			tr.resumes = append(tr.resumes, tr.series)
			return fmt.Sprintf("r%d", n), nil
		},
		resume: func() (string, error) { return fmt.Sprintf("d%d", n), nil },
	}
	return tr
}

// TestServe drives serve through a pipe as the host would over the serial
// console: garbage, over-long lines and partial lines are skipped, and
// every well-formed ping is answered in order.
func TestServe(t *testing.T) {
	hostR, agentW := io.Pipe()
	agentR, hostW := io.Pipe()
	done := make(chan error, 1)
	tr := newTestResponder(t)
	go func() {
		done <- serve(struct {
			io.Reader
			io.Writer
		}{agentR, agentW}, tr.responder)
	}()
	replies := bufio.NewReader(hostR)
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(hostW, s); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want string) {
		t.Helper()
		got, err := replies.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("agent answered %q, want %q", got, want)
		}
	}

	send("garbage\n\nPING\n")
	send(strings.Repeat("PING x", 100) + "\n") // longer than a line may be
	tr.series = "a"
	send("PING a-1\n")
	expect("PONG a-1 tok123 1234 d1 r1 none\n")
	send("PING a-") // a line split across writes
	send("2\r\n")
	expect("PONG a-2 tok123 1234 d1 r1 none\n")
	// A new series (a restored guest pinged by a new connection) runs the
	// resume work again before its first answer, and only then.
	tr.series = "b-x"
	send("\nPING b-x-1\nPING b-x-2\n")
	expect("PONG b-x-1 tok123 1234 d2 r2 none\n")
	expect("PONG b-x-2 tok123 1234 d2 r2 none\n")
	tr.series = "solo"
	send("PING solo\n")
	expect("PONG solo tok123 1234 d3 r3 none\n")

	hostW.Close()
	if err := <-done; !errors.Is(err, io.EOF) {
		t.Fatalf("serve returned %v after the console closed, want EOF", err)
	}
	if want := []string{"a", "b-x", "solo"}; !slices.Equal(tr.resumes, want) {
		t.Errorf("resume work ran for series %q, want %q", tr.resumes, want)
	}
}

// TestSeedReseedsOnlyTheSeriesItCameWith: the host's entropy sent just
// before the ping that opens a series is mixed in before the random bytes
// are drawn; a seed sent with a later ping of a series changes nothing,
// and is not kept for the next series, which gets its own or none.
func TestSeedReseedsOnlyTheSeriesItCameWith(t *testing.T) {
	seedA := strings.Repeat("a1", seedBytes)
	seedB := strings.Repeat("b2", seedBytes)
	var mixed []string
	var order []string
	r := &responder{
		token:  "tok",
		uptime: func() time.Duration { return time.Second },
		logf:   t.Logf,
		reseed: func(seed []byte) error {
			mixed = append(mixed, hex.EncodeToString(seed))
			order = append(order, "reseed")
			return nil
		},
		draw: func() (string, error) {
			order = append(order, "draw")
			return "rr", nil
		},
		resume: func() (string, error) { return "dd", nil },
	}
	feed := func(line string) string {
		t.Helper()
		if seed, ok := parseSeed([]byte(line)); ok {
			r.offer(seed)
			return ""
		}
		nonce, ok := parsePing([]byte(line))
		if !ok {
			t.Fatalf("%q is neither a seed nor a ping", line)
		}
		return r.answer(nonce)
	}
	feed("SEED " + seedA + "\n")
	if got := feed("PING a-1\n"); got != "PONG a-1 tok 1000 dd rr host\n" {
		t.Fatalf("first answer %q", got)
	}
	feed("SEED " + seedB + "\n")
	feed("PING a-2\n") // same series: the seed is not used, and dropped
	if got := feed("PING b-1\n"); got != "PONG b-1 tok 1000 dd rr none\n" {
		t.Fatalf("a series opened without a seed answered %q, want reseed none", got)
	}
	if !slices.Equal(mixed, []string{seedA}) {
		t.Errorf("mixed in %q, want only the first series' seed", mixed)
	}
	if want := []string{"reseed", "draw", "draw"}; !slices.Equal(order, want) {
		t.Errorf("steps ran as %q, want %q (reseed before the draw)", order, want)
	}
	for _, bad := range []string{"SEED " + seedA[:62] + "\n", "SEED " + seedA + "00\n", "SEED " + strings.Repeat("zz", seedBytes) + "\n", "SEED\n"} {
		if _, ok := parseSeed([]byte(bad)); ok {
			t.Errorf("parseSeed accepted %q", bad)
		}
	}
}

func TestFailedStepsAnswerWithoutTheirResult(t *testing.T) {
	var logged []string
	r := &responder{
		token:  "tok",
		uptime: func() time.Duration { return time.Second },
		resume: func() (string, error) { return "", errors.New("data file gone") },
		reseed: func([]byte) error { return errors.New("no /dev/urandom") },
		draw:   func() (string, error) { return "", errors.New("getrandom failed") },
		logf:   func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) },
	}
	seed, _ := parseSeed([]byte("SEED " + strings.Repeat("00", seedBytes)))
	r.offer(seed)
	if got := r.answer("n-1"); got != "PONG n-1 tok 1000 - - failed\n" {
		t.Errorf("answer after failed steps %q", got)
	}
	if len(logged) != 3 || !strings.Contains(strings.Join(logged, "|"), "data file gone") {
		t.Errorf("logged %q", logged)
	}
}

func TestStartup(t *testing.T) {
	data := t.TempDir()
	files := map[string]string{"b.bin": "bravo", "a.conf": "alpha", "sub/c.bin": "charlie"}
	for name, content := range files {
		p := filepath.Join(data, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proc := filepath.Join(t.TempDir(), "version")
	if err := os.WriteFile(proc, []byte("Linux version x"), 0o644); err != nil {
		t.Fatal(err)
	}

	st, err := startup([]string{proc}, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.heap) != heapBytes {
		t.Errorf("heap is %d bytes, want %d", len(st.heap), heapBytes)
	}
	for i := 0; i < len(st.heap); i += 4096 {
		if st.heap[i] == 0 && st.heap[i+1] == 0 && st.heap[i+2] == 0 && st.heap[i+3] == 0 {
			t.Fatalf("heap page at %d was not filled", i)
		}
	}
	if st.filesRead != 4 || st.bytesRead != int64(len("Linux version x")+len("bravo")+len("alpha")+len("charlie")) {
		t.Errorf("read %d files, %d bytes", st.filesRead, st.bytesRead)
	}

	again, err := startup([]string{proc}, data)
	if err != nil {
		t.Fatal(err)
	}
	if again.digest != st.digest {
		t.Error("digest differs between two runs over the same inputs")
	}
	if err := os.WriteFile(filepath.Join(data, "a.conf"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err := startup([]string{proc}, data)
	if err != nil {
		t.Fatal(err)
	}
	if changed.digest == st.digest {
		t.Error("digest ignores the data files")
	}
	if _, err := hex.DecodeString(st.digest); err != nil || len(st.digest) != 2*sha256.Size {
		t.Errorf("digest %q is not a hex SHA-256", st.digest)
	}

	if _, err := startup([]string{filepath.Join(data, "missing")}, data); err == nil {
		t.Error("startup ignored a missing /proc file")
	}
}

// TestResume: the resume digest is stable while the state is, and moves
// when any heap page or data file page does.
func TestResume(t *testing.T) {
	data := t.TempDir()
	big := make([]byte, 3*pageBytes+100) // a tail shorter than a page
	for i := range big {
		big[i] = byte(i * 7)
	}
	files := map[string][]byte{"a.bin": big, "b.conf": []byte("short")}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(data, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := startup(nil, data)
	if err != nil {
		t.Fatal(err)
	}
	d1, err := st.resume()
	if err != nil {
		t.Fatal(err)
	}
	if len(d1) != 16 {
		t.Fatalf("digest %q is not 16 hex digits", d1)
	}
	if d2, err := st.resume(); err != nil || d2 != d1 {
		t.Fatalf("second resume: %q, %v; want %q", d2, err, d1)
	}
	// A heap page whose sampled word differs, as a page served from the
	// wrong offset would.
	page := 100
	off := page*pageBytes + (page%wordsPerPage)*wordBytes
	st.heap[off] ^= 1
	if d, _ := st.resume(); d == d1 {
		t.Error("digest ignores a changed heap page")
	}
	st.heap[off] ^= 1
	// A data file page.
	changed := append([]byte(nil), big...)
	changed[pageBytes+wordBytes] ^= 1 // the word page 1 samples
	if err := os.WriteFile(filepath.Join(data, "a.bin"), changed, 0o644); err != nil {
		t.Fatal(err)
	}
	if d, _ := st.resume(); d == d1 {
		t.Error("digest ignores a changed data file page")
	}
	// A data file that outgrew its start-up size.
	if err := os.WriteFile(filepath.Join(data, "a.bin"), append(big, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := st.resume(); err == nil {
		t.Error("resume accepted a data file larger than at start-up")
	}
}

// TestDataDirMatchesInitramfs holds the agent to the directory the
// initramfs packs its data files into.
func TestDataDirMatchesInitramfs(t *testing.T) {
	if dataDir != initramfs.DataDir {
		t.Fatalf("agent reads %s, initramfs packs %s", dataDir, initramfs.DataDir)
	}
}
