package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"warmstart/internal/agentspec"
)

// plenty is a guest with memory to spare.
func plenty() (int64, error) { return 1 << 30, nil }

// stateResponder is a responder whose store holds at most limitBytes.
func stateResponder(t *testing.T, limitBytes int64, available func() (int64, error)) *responder {
	r := newTestResponder(t).responder
	r.state = newStateStore(limitBytes, available)
	return r
}

// ask hands r one request line and returns its answer ("" for none).
func ask(r *responder, line string) string {
	reply, _ := r.handle([]byte(line + "\n"))
	return reply
}

// TestWriteAnswersThePatternsDigest: WRITE fills the buffer with the
// seed's pattern and answers the digest a host computes without a guest;
// STATE reads every buffer back, sorted by key.
func TestWriteAnswersThePatternsDigest(t *testing.T) {
	r := stateResponder(t, 64<<20, plenty)
	if got, want := ask(r, "WRITE n-1 disk 16 7"), fmt.Sprintf("WROTE n-1 disk %s\n", agentspec.StateDigest(16, 7)); got != want {
		t.Fatalf("WRITE answered %q, want %q", got, want)
	}
	if got, want := ask(r, "WRITE n-2 cache.a 4 18446744073709551615"), fmt.Sprintf("WROTE n-2 cache.a %s\n", agentspec.StateDigest(4, 1<<64-1)); got != want {
		t.Fatalf("WRITE answered %q, want %q", got, want)
	}
	want := fmt.Sprintf("STATE n-3 cache.a=%s disk=%s\n", agentspec.StateDigest(4, 1<<64-1), agentspec.StateDigest(16, 7))
	if got := ask(r, "STATE n-3"); got != want {
		t.Fatalf("STATE answered %q, want %q", got, want)
	}
	if r.state.held != 20<<10 {
		t.Errorf("store holds %d bytes, want 20 KiB", r.state.held)
	}
	// A page lost in a snapshot reads as zeros: STATE reads it again.
	clear(r.state.buffers["disk"][4096:8192])
	if got := ask(r, "STATE n-4"); strings.Contains(got, "disk="+agentspec.StateDigest(16, 7)) {
		t.Errorf("STATE after a page of disk was zeroed still answers its digest: %q", got)
	}
	// Refilled in place with another seed; resized with another size.
	before := &r.state.buffers["disk"][0]
	if got := ask(r, "WRITE n-5 disk 16 8"); got != fmt.Sprintf("WROTE n-5 disk %s\n", agentspec.StateDigest(16, 8)) {
		t.Fatalf("rewrite answered %q", got)
	}
	if &r.state.buffers["disk"][0] != before {
		t.Error("a buffer rewritten at its own size was reallocated")
	}
	ask(r, "WRITE n-6 disk 8 8")
	if r.state.held != 12<<10 || len(r.state.buffers["disk"]) != 8<<10 {
		t.Errorf("after resizing disk to 8 KiB the store holds %d bytes, disk %d", r.state.held, len(r.state.buffers["disk"]))
	}
}

// TestStateOfAnEmptyStore: no buffers, no pairs.
func TestStateOfAnEmptyStore(t *testing.T) {
	r := stateResponder(t, 1<<20, plenty)
	if got := ask(r, "STATE x-1"); got != "STATE x-1\n" {
		t.Fatalf("STATE of an empty store answered %q", got)
	}
}

// TestStateRequestsAreBounded: what would break the cap, the key limit or
// the guest's free memory, and malformed requests, answer ERR with the
// nonce; lines without a valid nonce get no answer.
func TestStateRequestsAreBounded(t *testing.T) {
	r := stateResponder(t, 64<<10, plenty)
	if got := ask(r, "WRITE a-1 big 48 1"); !strings.HasPrefix(got, "WROTE a-1 big ") {
		t.Fatalf("WRITE within the cap answered %q", got)
	}
	for line, reason := range map[string]string{
		"WRITE a-2 more 17 1":           "over the state cap",
		"WRITE a-3 huge 65 1":           "over the state cap",
		"WRITE a-4 zero 0 1":            "over the state cap",
		"WRITE a-5 neg -1 1":            "over the state cap",
		"WRITE a-6 bad/key 1 1":         "is not 1-64",
		"WRITE a-7 k 1":                 usageWrite,
		"WRITE a-8 k x 1":               "decimal",
		"WRITE a-9 k 1 -3":              "decimal",
		"WRITE a-10 k 1 1 extra":        usageWrite,
		"STATE a-11 extra":              usageState,
		"WRITE a-12 " + long65 + " 1 1": "is not 1-64",
	} {
		nonce := strings.Fields(line)[1]
		got := ask(r, line)
		if !strings.HasPrefix(got, "ERR "+nonce+" ") || !strings.Contains(got, reason) || strings.Count(got, "\n") != 1 {
			t.Errorf("%q answered %q, want ERR %s ... %s", line, got, nonce, reason)
		}
	}
	if r.state.held != 48<<10 || len(r.state.buffers) != 1 {
		t.Errorf("refused requests changed the store: %d bytes in %d buffers", r.state.held, len(r.state.buffers))
	}
	for _, line := range []string{"WRITE bad/nonce k 1 1", "WRITE", "STATE", "STATE " + long65, "write a-1 k 1 1"} {
		if reply, ok := r.handle([]byte(line + "\n")); ok {
			t.Errorf("%q without a valid nonce answered %q", line, reply)
		}
	}
}

var long65 = strings.Repeat("k", agentspec.MaxKeyBytes+1)

func TestStateKeysAreLimited(t *testing.T) {
	r := stateResponder(t, 1<<30, plenty)
	for i := range agentspec.MaxStateKeys {
		if got := ask(r, fmt.Sprintf("WRITE k-%d key%d 1 1", i, i)); !strings.HasPrefix(got, "WROTE ") {
			t.Fatalf("key %d refused: %q", i, got)
		}
	}
	if got := ask(r, "WRITE k-x one-more 1 1"); !strings.Contains(got, "too many state buffers") {
		t.Errorf("key %d answered %q", agentspec.MaxStateKeys+1, got)
	}
	if got := ask(r, "WRITE k-y key0 2 1"); !strings.HasPrefix(got, "WROTE ") {
		t.Errorf("rewriting a held key at the key limit answered %q", got)
	}
}

// TestWriteLeavesTheGuestMemory: a buffer that would leave the guest less
// than the reserve, or whose free memory cannot be read, is refused.
func TestWriteLeavesTheGuestMemory(t *testing.T) {
	avail := int64(stateReserveBytes + 1<<20)
	r := stateResponder(t, 1<<30, func() (int64, error) { return avail, nil })
	if got := ask(r, "WRITE m-1 fits 1024 1"); !strings.HasPrefix(got, "WROTE ") {
		t.Fatalf("a buffer that leaves the reserve answered %q", got)
	}
	if got := ask(r, "WRITE m-2 tight 1025 1"); !strings.Contains(got, "not enough free guest memory") {
		t.Errorf("a buffer that eats into the reserve answered %q", got)
	}
	r.state.available = func() (int64, error) { return 0, errors.New("no /proc") }
	if got := ask(r, "WRITE m-3 blind 1 1"); !strings.Contains(got, "no /proc") {
		t.Errorf("a WRITE without MemAvailable answered %q", got)
	}
	// A rewrite in place needs no memory.
	if got := ask(r, "WRITE m-4 fits 1024 2"); !strings.HasPrefix(got, "WROTE ") {
		t.Errorf("a rewrite in place answered %q", got)
	}
}

// TestFullStateAnswerFitsAHostLine: the longest STATE answer (every key
// at its longest) is one line the host reads whole.
func TestFullStateAnswerFitsAHostLine(t *testing.T) {
	r := stateResponder(t, 1<<30, plenty)
	for i := range agentspec.MaxStateKeys {
		key := fmt.Sprintf("%02d", i) + strings.Repeat("k", agentspec.MaxKeyBytes-2)
		ask(r, fmt.Sprintf("WRITE f-%d %s 1 1", i, key))
	}
	got := ask(r, "STATE "+strings.Repeat("n", maxNonceBytes))
	if n := strings.Count(got, "="); n != agentspec.MaxStateKeys {
		t.Fatalf("STATE names %d keys, want %d", n, agentspec.MaxStateKeys)
	}
	if len(got) > agentspec.MaxReplyBytes {
		t.Errorf("the longest STATE answer is %d bytes, the host reads %d", len(got), agentspec.MaxReplyBytes)
	}
}

func TestMeminfoBytes(t *testing.T) {
	meminfo := []byte("MemTotal:         241932 kB\nMemFree:          1 kB\nMemAvailable:     190228 kB\n")
	if n, err := meminfoBytes(meminfo, "MemAvailable:"); err != nil || n != 190228<<10 {
		t.Errorf("MemAvailable = %d, %v", n, err)
	}
	if _, err := meminfoBytes(meminfo, "SwapTotal:"); err == nil {
		t.Error("a missing field read as a value")
	}
	if _, err := meminfoBytes([]byte("MemTotal: lots kB\n"), "MemTotal:"); err == nil {
		t.Error("a malformed value read as a number")
	}
}

// TestStateRequestsKeepTheirPlace: over the console, a state request is
// answered in line with the pings around it, and opens no nonce series:
// the ping after a WRITE of a new connection's series still runs the
// resume work, which the host's fence ping relies on.
func TestStateRequestsKeepTheirPlace(t *testing.T) {
	tr := newTestResponder(t)
	tr.state = newStateStore(1<<20, plenty)
	var out strings.Builder
	in := strings.NewReader("PING a-1\nWRITE b-1 k 4 9\nPING b-2\nSTATE b-3\n")
	if err := serve(struct {
		*strings.Reader
		*strings.Builder
	}{in, &out}, tr.responder); err == nil {
		t.Fatal("serve returned no error at the end of its input")
	}
	d := agentspec.StateDigest(4, 9)
	want := "PONG a-1 tok123 1234 d1 r1 none\n" +
		"WROTE b-1 k " + d + "\n" +
		"PONG b-2 tok123 1234 d2 r2 none\n" +
		"STATE b-3 k=" + d + "\n"
	if out.String() != want {
		t.Fatalf("answers:\n%s\nwant:\n%s", out.String(), want)
	}
}
