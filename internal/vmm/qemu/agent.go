package qemu

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/agentspec"
	"warmstart/internal/vmm"
)

// Probe pacing. The first ping goes out at once and later ones back off:
// a ping the guest cannot read yet waits in the socket and is answered the
// moment the agent runs, so the interval does not limit how precisely
// readiness is timed, only how many pings queue up meanwhile.
const (
	firstProbeInterval = 10 * time.Millisecond
	maxProbeInterval   = 250 * time.Millisecond
)

// Serial console reading limits.
const (
	maxConsoleLineBytes = agentspec.MaxReplyBytes
	recentLinesKept     = 16
	pongQueueLen        = 16
)

// pong is one answer of the agent.
type pong struct {
	nonce  string
	token  string
	uptime time.Duration
	// digest is the agent's digest of its memory state after its resume
	// work; empty from an agent that predates it.
	digest string
	// random is hex of the bytes the agent drew from the guest kernel's
	// RNG after it reseeded it, and reseed how that went ("host", "none",
	// "failed"); both empty from an agent that predates them.
	random, reseed string
	at             time.Time // when the answer was read
}

// answer is the agent's answer to a state request: "WROTE", "STATE" or
// "ERR", with the fields after the nonce.
type answer struct {
	verb, nonce string
	args        []string
}

// Verbs of the state requests and their answers.
const (
	verbWrite = "WRITE"
	verbWrote = "WROTE"
	verbState = "STATE"
	verbErr   = "ERR"
)

// parseAnswer reads "<verb> <nonce> <fields...>" for the answers of state
// requests.
func parseAnswer(line string) (answer, bool) {
	f := strings.Fields(line)
	if len(f) < 2 || (f[0] != verbWrote && f[0] != verbState && f[0] != verbErr) {
		return answer{}, false
	}
	return answer{verb: f[0], nonce: f[1], args: f[2:]}, true
}

// agentConn speaks the agent's protocol over the guest's serial console
// (see cmd/warmstart-agent). A reader goroutine splits the console into
// lines: answers to pings go to pongs, answers to state requests to
// answers, everything else (kernel messages, agent logs) is kept for error
// reports.
type agentConn struct {
	conn net.Conn
	// prefix starts every nonce of this connection ("<prefix>-<seq>"). The
	// agent treats a ping with a prefix it has not just answered as the
	// first after a resume and does its resume work before answering, so
	// each connection, that is each QEMU process, needs its own.
	prefix string
	// seeds sends host entropy with every ping (a SEED line before it),
	// which the agent mixes into the guest's RNG when the ping opens a
	// series; agents that predate it ignore the line.
	seeds   bool
	seq     atomic.Uint64
	pongs   chan pong
	answers chan answer
	done    chan struct{} // closed when the reader stops
	err     error         // why the reader stopped; read after done closes

	exchangeMu sync.Mutex // one ping or request exchange at a time

	linesMu sync.Mutex
	lines   []string
}

func newAgentConn(conn net.Conn, seeds bool) *agentConn {
	var b [4]byte
	rand.Read(b[:])
	a := &agentConn{
		conn:    conn,
		prefix:  hex.EncodeToString(b[:]),
		seeds:   seeds,
		pongs:   make(chan pong, pongQueueLen),
		answers: make(chan answer, pongQueueLen),
		done:    make(chan struct{}),
	}
	go a.read()
	return a
}

func (a *agentConn) read() {
	defer close(a.done)
	r := bufio.NewReaderSize(a.conn, maxConsoleLineBytes)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			a.err = fmt.Errorf("read serial console: %w", err)
			return
		}
		at := time.Now()
		text := strings.TrimRight(string(line), "\r\n")
		if p, ok := parsePong(text); ok {
			p.at = at
			select {
			case a.pongs <- p:
			default: // nobody is waiting and the queue is full of stale answers
			}
			continue
		}
		if ans, ok := parseAnswer(text); ok {
			select {
			case a.answers <- ans:
			default:
			}
			continue
		}
		if strings.TrimSpace(text) != "" {
			a.remember(text)
		}
	}
}

// parsePong reads "PONG <nonce> <token> <uptime_ms> <digest> <random>
// <reseed>", and the answers of agents that predate the last two, or the
// last three.
func parsePong(line string) (pong, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f) > 7 || len(f) == 6 || f[0] != "PONG" {
		return pong{}, false
	}
	ms, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || ms < 0 {
		return pong{}, false
	}
	p := pong{nonce: f[1], token: f[2], uptime: time.Duration(ms) * time.Millisecond}
	if len(f) >= 5 {
		p.digest = f[4]
	}
	if len(f) == 7 {
		p.random, p.reseed = f[5], f[6]
	}
	return p, true
}

func (a *agentConn) remember(line string) {
	const maxKeptBytes = 200
	if len(line) > maxKeptBytes {
		line = line[:maxKeptBytes] + "…"
	}
	a.linesMu.Lock()
	defer a.linesMu.Unlock()
	if len(a.lines) == recentLinesKept {
		copy(a.lines, a.lines[1:])
		a.lines = a.lines[:recentLinesKept-1]
	}
	a.lines = append(a.lines, line)
}

// recentLines returns the last console lines that were not answers.
func (a *agentConn) recentLines() []string {
	a.linesMu.Lock()
	defer a.linesMu.Unlock()
	return append([]string(nil), a.lines...)
}

// ping sends pings until the agent answers one of them, QEMU exits, the
// console closes or ctx ends. Only answers to pings of this call count.
func (a *agentConn) ping(ctx context.Context, exited <-chan struct{}) (pong, error) {
	a.exchangeMu.Lock()
	defer a.exchangeMu.Unlock()
	drain(a.pongs)
	sent := make(map[string]bool)
	interval := firstProbeInterval
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		nonce := a.nextNonce()
		// The leading newline ends any partial line left in the guest's
		// input, such as the rest of a ping cut off by a write deadline.
		a.conn.SetWriteDeadline(time.Now().Add(interval))
		n, err := a.conn.Write(a.pingRequest(nonce))
		if n > 0 {
			sent[nonce] = true
		}
		// A write that hits its deadline means the guest is not reading
		// yet and the socket is full of earlier pings: try again later.
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return pong{}, fmt.Errorf("send ping: %w", err)
		}
		timer.Reset(interval)
	wait:
		for {
			select {
			case p := <-a.pongs:
				if sent[p.nonce] {
					return p, nil
				}
			case <-timer.C:
				break wait
			case <-exited:
				return pong{}, ErrExited
			case <-a.done:
				return pong{}, a.err
			case <-ctx.Done():
				return pong{}, ctx.Err()
			}
		}
		interval = min(2*interval, maxProbeInterval)
	}
}

// seedBytes is the host entropy sent with each ping.
const seedBytes = 32

// nextNonce is the connection's next nonce: "<prefix>-<seq>".
func (a *agentConn) nextNonce() string {
	return a.prefix + "-" + strconv.FormatUint(a.seq.Add(1), 10)
}

// drain empties a queue of stale answers.
func drain[T any](c chan T) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// pingRequest is what one ping writes: the ping, after fresh host entropy
// for the guest's RNG when the connection sends seeds. One write carries
// both, so the seed the agent holds when the ping arrives is this ping's.
func (a *agentConn) pingRequest(nonce string) []byte {
	if !a.seeds {
		return []byte("\nPING " + nonce + "\n")
	}
	seed := make([]byte, seedBytes)
	rand.Read(seed)
	return []byte("\nSEED " + hex.EncodeToString(seed) + "\nPING " + nonce + "\n")
}

// ask sends one state request and returns the agent's answer to it. The
// agent answers requests in order and ignores lines it does not know, so a
// fence ping follows the request in the same write: its answer arriving
// first means an agent without state requests (ErrNoStateAgent), where
// waiting would last until ctx ends. A fence that opens the connection's
// nonce series has the agent do its resume work, with a seed, as any first
// ping does. The request is sent once: the console is a reliable stream.
func (a *agentConn) ask(ctx context.Context, exited <-chan struct{}, verb string, args ...string) (answer, error) {
	a.exchangeMu.Lock()
	defer a.exchangeMu.Unlock()
	drain(a.pongs)
	drain(a.answers)
	nonce, fence := a.nextNonce(), a.nextNonce()
	req := append([]byte("\n"+strings.Join(append([]string{verb, nonce}, args...), " ")+"\n"), a.pingRequest(fence)...)
	if err := a.write(ctx, req); err != nil {
		return answer{}, fmt.Errorf("send %s: %w", verb, err)
	}
	for {
		select {
		case ans := <-a.answers:
			if ans.nonce == nonce {
				return ans, nil
			}
		case p := <-a.pongs:
			if p.nonce != fence {
				continue
			}
			// The reader queues lines in the agent's order, so an
			// answer to the request is queued by now: select picks
			// among ready channels at random, and may have picked
			// the fence first.
			if ans, ok := a.queuedAnswer(nonce); ok {
				return ans, nil
			}
			return answer{}, fmt.Errorf("%s: %w: it answered the ping after the request, not the request", verb, vmm.ErrNoStateAgent)
		case <-exited:
			return answer{}, ErrExited
		case <-a.done:
			return answer{}, a.err
		case <-ctx.Done():
			return answer{}, ctx.Err()
		}
	}
}

// queuedAnswer takes the answer to nonce from the queue, if it is there.
func (a *agentConn) queuedAnswer(nonce string) (answer, bool) {
	for {
		select {
		case ans := <-a.answers:
			if ans.nonce == nonce {
				return ans, true
			}
		default:
			return answer{}, false
		}
	}
}

// write writes b to the console, giving up when ctx ends.
func (a *agentConn) write(ctx context.Context, b []byte) error {
	a.conn.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { a.conn.SetWriteDeadline(time.Now()) })
	_, err := a.conn.Write(b)
	stop()
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (a *agentConn) close() {
	a.conn.Close()
	<-a.done
}
