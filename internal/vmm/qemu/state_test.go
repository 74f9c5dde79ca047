package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"warmstart/internal/agentspec"
	"warmstart/internal/vmm"
)

// stateGuest answers pings and state requests on conn the way the agent
// does, with kernel noise in between; refuse makes it answer every WRITE
// with ERR. Without state it is an agent older than the requests: it
// answers pings only.
func stateGuest(conn net.Conn, state bool, refuse string) {
	buffers := map[string]string{}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		var reply string
		switch {
		case f[0] == "PING":
			reply = "PONG " + f[1] + " tok 42 feed\n"
		case f[0] == "WRITE" && state && refuse != "":
			reply = "ERR " + f[1] + " " + refuse + "\n"
		case f[0] == "WRITE" && state && len(f) == 5:
			kib, _ := strconv.ParseInt(f[3], 10, 64)
			seed, _ := strconv.ParseUint(f[4], 10, 64)
			buffers[f[2]] = agentspec.StateDigest(kib, seed)
			reply = "WROTE " + f[1] + " " + f[2] + " " + buffers[f[2]] + "\n"
		case f[0] == "STATE" && state:
			var pairs []string
			for k, d := range buffers {
				pairs = append(pairs, k+"="+d)
			}
			sort.Strings(pairs)
			reply = strings.Join(append([]string{"STATE", f[1]}, pairs...), " ") + "\n"
		default:
			continue
		}
		conn.Write([]byte("[    9.9] kernel noise\n" + reply))
	}
}

// consoleMachine is a Machine whose serial console is conn; there is no
// QEMU behind it.
func consoleMachine(t *testing.T, conn net.Conn) *Machine {
	m := &Machine{exited: make(chan struct{}), agent: newAgentConn(conn, true)}
	t.Cleanup(m.agent.close)
	return m
}

func TestWriteStateAndReadItBack(t *testing.T) {
	host, guest := socketPair(t)
	go stateGuest(guest, true, "")
	m := consoleMachine(t, host)
	ctx := context.Background()
	var sa vmm.StateAgent = m
	d, err := sa.WriteState(ctx, "disk", 16, 7)
	if err != nil || d != agentspec.StateDigest(16, 7) {
		t.Fatalf("WriteState = %q, %v; want %q", d, err, agentspec.StateDigest(16, 7))
	}
	if _, err := sa.WriteState(ctx, "cache.a", 4, 1); err != nil {
		t.Fatal(err)
	}
	state, err := sa.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"disk": d, "cache.a": agentspec.StateDigest(4, 1)}
	if fmt.Sprint(state) != fmt.Sprint(want) {
		t.Errorf("State = %v, want %v", state, want)
	}
	// A ping between requests is still answered: the fences left nothing.
	if _, err := m.agent.ping(ctx, m.exited); err != nil {
		t.Fatal(err)
	}
}

// TestStateRequestsRefused: what the host can tell is bad never reaches
// the guest, what the agent refuses says why, both as ErrStateRefused.
func TestStateRequestsRefused(t *testing.T) {
	host, guest := socketPair(t)
	go stateGuest(guest, true, "over the state cap: 65536 KiB")
	m := consoleMachine(t, host)
	ctx := context.Background()
	for _, tc := range []struct {
		key  string
		kib  int64
		want string
	}{
		{"bad key", 1, "is not 1-64"},
		{"", 1, "is not 1-64"},
		{"k", 0, "0 KiB"},
		{"k", 65536, "over the state cap: 65536 KiB"},
	} {
		_, err := m.WriteState(ctx, tc.key, tc.kib, 1)
		if !errors.Is(err, vmm.ErrStateRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("WriteState(%q, %d) = %v, want ErrStateRefused saying %q", tc.key, tc.kib, err, tc.want)
		}
	}
}

// TestStateOfAnAgentWithoutIt: an agent older than the state requests
// ignores them; the fence ping's answer says so at once.
func TestStateOfAnAgentWithoutIt(t *testing.T) {
	host, guest := socketPair(t)
	go stateGuest(guest, false, "")
	m := consoleMachine(t, host)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := m.WriteState(ctx, "k", 1, 1); !errors.Is(err, vmm.ErrNoStateAgent) {
		t.Errorf("WriteState on an old agent = %v, want ErrNoStateAgent", err)
	}
	if _, err := m.State(ctx); !errors.Is(err, vmm.ErrNoStateAgent) {
		t.Errorf("State on an old agent = %v, want ErrNoStateAgent", err)
	}
}

// TestStateRequestEnds: a guest that never answers holds a request only
// until its context ends or QEMU exits.
func TestStateRequestEnds(t *testing.T) {
	host, _ := socketPair(t)
	m := consoleMachine(t, host)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.State(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("State with a cancelled context = %v", err)
	}
	close(m.exited)
	if _, err := m.WriteState(context.Background(), "k", 1, 1); !errors.Is(err, ErrExited) {
		t.Errorf("WriteState on an exited QEMU = %v", err)
	}
}

func TestParseStateAnswer(t *testing.T) {
	d := agentspec.StateDigest(1, 1)
	if s, err := parseState([]string{"a=" + d, "b.c=" + d}); err != nil || len(s) != 2 || s["b.c"] != d {
		t.Errorf("parseState = %v, %v", s, err)
	}
	if s, err := parseState(nil); err != nil || len(s) != 0 {
		t.Errorf("parseState of no pairs = %v, %v", s, err)
	}
	for _, bad := range [][]string{{"a"}, {"a=xyz"}, {"=" + d}, {"a b=" + d}, {"a=" + d, "a=" + d}, {"a=" + d + "0"}} {
		if _, err := parseState(bad); err == nil {
			t.Errorf("parseState accepted %q", bad)
		}
	}
}

// TestAgentWorkloadReachesTheKernelCommandLine: the configured workload is
// checked by New and appended to the command line Boot gives the kernel.
func TestAgentWorkloadReachesTheKernelCommandLine(t *testing.T) {
	d, err := New(Options{Binary: os.Args[0], Accel: AccelTCG, MemoryMiB: 256, AgentWorkload: "heap_mib=40,pool_mib=24,pool_fraction=0.33"})
	if err != nil {
		t.Fatal(err)
	}
	got := d.kernelCmdline()
	if want := BootAppend + " warmstart.heap_mib=40 warmstart.pool_mib=24 warmstart.pool_fraction=0.33"; got != want {
		t.Errorf("kernel command line %q, want %q", got, want)
	}
	if w, err := agentspec.FromCmdline(got); err != nil || w != (agentspec.Workload{HeapMiB: 40, PoolMiB: 24, PoolFraction: 0.33}) {
		t.Errorf("the agent reads %+v, %v from it", w, err)
	}
	light, err := New(Options{Binary: os.Args[0], Accel: AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	if got := light.kernelCmdline(); got != BootAppend {
		t.Errorf("the light start-up's command line is %q, want %q", got, BootAppend)
	}
	for _, bad := range []Options{
		{Binary: os.Args[0], AgentWorkload: "heap_mib=lots"},
		{Binary: os.Args[0], AgentWorkload: "heap_mib=65"}, // over half of 128 MiB
	} {
		if _, err := New(bad); !errors.Is(err, agentspec.ErrWorkload) {
			t.Errorf("New(%+v) = %v, want an ErrWorkload", bad, err)
		}
	}
}

// TestAnswerBeforeFenceWins: the agent answers a request before the fence
// ping after it, and the two answers often reach the host together; the
// request's answer must win however the host's goroutines are scheduled.
func TestAnswerBeforeFenceWins(t *testing.T) {
	host, guest := socketPair(t)
	go func() {
		sc := bufio.NewScanner(guest)
		var wrote string
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 5 && f[0] == "WRITE":
				wrote = "WROTE " + f[1] + " " + f[2] + " " + agentspec.StateDigest(1, 1) + "\n"
			case len(f) == 2 && f[0] == "PING":
				// Both answers in one write, in the agent's order.
				guest.Write([]byte(wrote + "PONG " + f[1] + " tok 42 feed\n"))
				wrote = ""
			}
		}
	}()
	m := consoleMachine(t, host)
	for i := range 500 {
		if _, err := m.WriteState(context.Background(), "k", 1, 1); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}
