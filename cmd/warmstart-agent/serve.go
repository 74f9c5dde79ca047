package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// maxLineBytes bounds one request line. A longer line is garbage (line noise
// or a partial line left over from before a snapshot) and is skipped whole.
const maxLineBytes = 256

// maxNonceBytes bounds the nonce the host sends with each ping.
const maxNonceBytes = 64

// seedBytes is the size of the host entropy a SEED line carries.
const seedBytes = 32

// responder answers pings: "PONG <nonce> <token> <uptime_ms> <digest>
// <random> <reseed>", and the state requests WRITE and STATE (see handle).
//
// Before the first answer of a new nonce series it does the resume work:
// it mixes the host's entropy into the kernel's RNG, draws random bytes
// from it, walks its state and keeps what each step returned for the
// answers of the series. A series is the nonce up to its last '-' (a
// nonce without one is a series of its own). Each host-side connection
// draws a random series prefix, and a restore is a new QEMU with a new
// connection, so the first ping after a resume always opens a series. The
// guest's clock gives no such signal: it carries on from the snapshot, and
// under emulation its jumps depend on the host's load. At boot the first
// ping opens a series too, so the digest the captured guest reported was
// computed by the same code on the same state.
type responder struct {
	token  string
	uptime func() time.Duration
	// resume does the resume work and returns the state's digest.
	resume func() (string, error)
	// reseed mixes host entropy into the kernel's RNG and reseeds it.
	reseed func(seed []byte) error
	// draw returns hex of fresh bytes of the kernel's RNG.
	draw func() (string, error)
	// logf reports a failed step; the answer then carries "-" for a
	// digest or random bytes, "failed" for a reseed.
	logf func(format string, args ...any)
	// state holds the buffers WRITE makes; nil answers WRITE with ERR.
	state *stateStore

	series   string // series of the last answered ping
	digest   string // "" until the first resume
	random   string
	reseeded string
	// seed is the host entropy of the SEED line read since the last ping:
	// it belongs to the next ping only, so the seed of an earlier
	// connection never stands in for a later one's.
	seed []byte
}

// Reseed outcomes an answer reports.
const (
	// reseedHost: the host's entropy was mixed in and the RNG reseeded.
	reseedHost = "host"
	// reseedNone: the host sent no entropy with the ping.
	reseedNone = "none"
	// reseedFailed: mixing it in or reseeding failed (logged).
	reseedFailed = "failed"
)

// offer keeps seed for the next ping.
func (r *responder) offer(seed []byte) {
	clear(r.seed)
	r.seed = seed
}

func (r *responder) answer(nonce string) string {
	seed := r.seed
	r.seed = nil
	defer clear(seed)
	if s := nonceSeries(nonce); s != r.series || r.digest == "" {
		r.series = s
		r.resumeWork(seed)
	}
	return fmt.Sprintf("PONG %s %s %d %s %s %s\n", nonce, r.token, r.uptime().Milliseconds(), r.digest, r.random, r.reseeded)
}

// resumeWork runs the resume steps in order: the RNG is reseeded before
// anything is drawn from it.
func (r *responder) resumeWork(seed []byte) {
	r.reseeded = reseedNone
	if seed != nil {
		r.reseeded = reseedHost
		if err := r.reseed(seed); err != nil {
			r.logf("reseed from host entropy: %v", err)
			r.reseeded = reseedFailed
		}
	}
	var err error
	if r.random, err = r.draw(); err != nil {
		r.logf("draw random bytes: %v", err)
		r.random = "-"
	}
	if r.digest, err = r.resume(); err != nil {
		r.logf("resume work: %v", err)
		r.digest = "-"
	}
}

// nonceSeries is the part of a nonce that names its sender's series.
func nonceSeries(nonce string) string {
	if i := strings.LastIndexByte(nonce, '-'); i >= 0 {
		return nonce[:i]
	}
	return nonce
}

// serve answers the requests read from rw until reading or writing fails.
// Each line is handed to r.handle; lines that are no request are ignored,
// so that console noise, echoes and partial lines cannot confuse the host.
func serve(rw io.ReadWriter, r *responder) error {
	br := bufio.NewReaderSize(rw, maxLineBytes)
	skipping := false // inside an over-long line, until its newline
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			skipping = true
			continue
		}
		if err != nil {
			return fmt.Errorf("read request: %w", err)
		}
		if skipping {
			skipping = false
			continue
		}
		reply, ok := r.handle(line)
		if !ok {
			continue
		}
		if _, err := io.WriteString(rw, reply); err != nil {
			return fmt.Errorf("write reply: %w", err)
		}
	}
}

// handle answers one request line: "PING <nonce>" with r.answer, "SEED
// <hex>" by keeping the entropy for the next ping (no answer), "WRITE" and
// "STATE" with the state store. ok is false when there is nothing to send.
func (r *responder) handle(line []byte) (reply string, ok bool) {
	if seed, ok := parseSeed(line); ok {
		r.offer(seed)
		return "", false
	}
	if nonce, ok := parsePing(line); ok {
		return r.answer(nonce), true
	}
	req, ok := parseRequest(line)
	if !ok {
		return "", false
	}
	switch req.verb {
	case verbWrite:
		return r.write(req), true
	case verbState:
		return r.readState(req), true
	}
	return "", false
}

// State requests.
const (
	verbWrite = "WRITE"
	verbState = "STATE"
	// usageWrite and usageState are what a malformed request is told.
	usageWrite = "usage: WRITE <nonce> <key> <n_kib> <seed>"
	usageState = "usage: STATE <nonce>"
)

// request is a state request with a well-formed nonce.
type request struct {
	verb, nonce string
	args        []string
}

// parseRequest reads "<verb> <nonce> <args...>" for the state verbs. A line
// whose nonce is malformed is no request: there is no nonce to answer.
func parseRequest(line []byte) (request, bool) {
	f := strings.Fields(string(bytes.TrimRight(line, "\r\n")))
	if len(f) < 2 || (f[0] != verbWrite && f[0] != verbState) || !validNonce(f[1]) {
		return request{}, false
	}
	return request{verb: f[0], nonce: f[1], args: f[2:]}, true
}

// write answers "WRITE <nonce> <key> <n_kib> <seed>": "WROTE <nonce> <key>
// <digest>", or "ERR <nonce> <reason>".
func (r *responder) write(req request) string {
	if len(req.args) != 3 {
		return errAnswer(req.nonce, usageWrite)
	}
	kib, err1 := strconv.ParseInt(req.args[1], 10, 64)
	seed, err2 := strconv.ParseUint(req.args[2], 10, 64)
	if err1 != nil || err2 != nil {
		return errAnswer(req.nonce, usageWrite+" (n_kib and seed are decimal)")
	}
	if r.state == nil {
		return errAnswer(req.nonce, "this agent keeps no state")
	}
	digest, err := r.state.write(req.args[0], kib, seed)
	if err != nil {
		return errAnswer(req.nonce, err.Error())
	}
	return fmt.Sprintf("WROTE %s %s %s\n", req.nonce, req.args[0], digest)
}

// readState answers "STATE <nonce>": "STATE <nonce> <key>=<digest>...",
// sorted by key.
func (r *responder) readState(req request) string {
	if len(req.args) != 0 {
		return errAnswer(req.nonce, usageState)
	}
	if r.state == nil {
		return fmt.Sprintf("STATE %s\n", req.nonce)
	}
	return strings.Join(append([]string{"STATE", req.nonce}, r.state.digests()...), " ") + "\n"
}

// maxReasonBytes keeps an ERR answer within one reply line.
const maxReasonBytes = 512

// errAnswer is "ERR <nonce> <reason>", the reason on one line.
func errAnswer(nonce, reason string) string {
	reason = strings.Join(strings.Fields(reason), " ")
	if len(reason) > maxReasonBytes {
		reason = reason[:maxReasonBytes]
	}
	return fmt.Sprintf("ERR %s %s\n", nonce, reason)
}

// parsePing returns the nonce of a well-formed ping line.
func parsePing(line []byte) (string, bool) {
	for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	const prefix = "PING "
	if len(line) <= len(prefix) || string(line[:len(prefix)]) != prefix {
		return "", false
	}
	nonce := string(line[len(prefix):])
	if !validNonce(nonce) {
		return "", false
	}
	return nonce, true
}

// validNonce: 1 to maxNonceBytes of [0-9A-Za-z_-].
func validNonce(nonce string) bool {
	if nonce == "" || len(nonce) > maxNonceBytes {
		return false
	}
	for i := 0; i < len(nonce); i++ {
		if !isNonceByte(nonce[i]) {
			return false
		}
	}
	return true
}

// parseSeed returns the entropy of a well-formed seed line:
// "SEED <seedBytes in hex>".
func parseSeed(line []byte) ([]byte, bool) {
	line = bytes.TrimRight(line, "\r\n")
	hexSeed, ok := bytes.CutPrefix(line, []byte("SEED "))
	if !ok || len(hexSeed) != 2*seedBytes {
		return nil, false
	}
	seed := make([]byte, seedBytes)
	if _, err := hex.Decode(seed, hexSeed); err != nil {
		return nil, false
	}
	return seed, true
}

func isNonceByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_'
}
