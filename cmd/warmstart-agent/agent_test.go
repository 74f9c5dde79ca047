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

// TestServe drives serve through a pipe as the host would over the serial
// console: garbage, over-long lines and partial lines are skipped, and
// every well-formed ping is answered in order.
func TestServe(t *testing.T) {
	hostR, agentW := io.Pipe()
	agentR, hostW := io.Pipe()
	done := make(chan error, 1)
	var resumes []string // nonce series each resume ran for
	digests := []string{"d1", "d2", "d3"}
	r := &responder{
		token:  "tok123",
		uptime: func() time.Duration { return 1234567 * time.Microsecond },
		logf:   t.Logf,
	}
	var series string
	r.resume = func() (string, error) {
		resumes = append(resumes, series)
		d := digests[0]
		digests = digests[1:]
		return d, nil
	}
	go func() {
		done <- serve(struct {
			io.Reader
			io.Writer
		}{agentR, agentW}, r)
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
	series = "a"
	send("PING a-1\n")
	expect("PONG a-1 tok123 1234 d1\n")
	send("PING a-") // a line split across writes
	send("2\r\n")
	expect("PONG a-2 tok123 1234 d1\n")
	// A new series (a restored guest pinged by a new connection) runs the
	// resume work again before its first answer, and only then.
	series = "b-x"
	send("\nPING b-x-1\nPING b-x-2\n")
	expect("PONG b-x-1 tok123 1234 d2\n")
	expect("PONG b-x-2 tok123 1234 d2\n")
	series = "solo"
	send("PING solo\n")
	expect("PONG solo tok123 1234 d3\n")

	hostW.Close()
	if err := <-done; !errors.Is(err, io.EOF) {
		t.Fatalf("serve returned %v after the console closed, want EOF", err)
	}
	if want := []string{"a", "b-x", "solo"}; !slices.Equal(resumes, want) {
		t.Errorf("resume work ran for series %q, want %q", resumes, want)
	}
}

func TestResumeFailureAnswersWithoutDigest(t *testing.T) {
	var logged []string
	r := &responder{
		token:  "tok",
		uptime: func() time.Duration { return time.Second },
		resume: func() (string, error) { return "", errors.New("data file gone") },
		logf:   func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) },
	}
	if got := r.answer("n-1"); got != "PONG n-1 tok 1000 -\n" {
		t.Errorf("answer after a failed resume %q", got)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "data file gone") {
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
