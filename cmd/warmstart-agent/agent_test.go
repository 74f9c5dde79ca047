package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
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
	go func() {
		done <- serve(struct {
			io.Reader
			io.Writer
		}{agentR, agentW}, "tok123", func() time.Duration { return 1234567 * time.Microsecond })
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
	send("PING one\n")
	expect("PONG one tok123 1234\n")
	send("PING tw") // a line split across writes
	send("o\r\n")
	expect("PONG two tok123 1234\n")
	send("\nPING three\nPING four\n")
	expect("PONG three tok123 1234\n")
	expect("PONG four tok123 1234\n")

	hostW.Close()
	if err := <-done; !errors.Is(err, io.EOF) {
		t.Fatalf("serve returned %v after the console closed, want EOF", err)
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

// TestDataDirMatchesInitramfs holds the agent to the directory the
// initramfs packs its data files into.
func TestDataDirMatchesInitramfs(t *testing.T) {
	if dataDir != initramfs.DataDir {
		t.Fatalf("agent reads %s, initramfs packs %s", dataDir, initramfs.DataDir)
	}
}
