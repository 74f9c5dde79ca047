package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// maxLineBytes bounds one request line. A longer line is garbage (line noise
// or a partial line left over from before a snapshot) and is skipped whole.
const maxLineBytes = 256

// maxNonceBytes bounds the nonce the host sends with each ping.
const maxNonceBytes = 64

// responder answers pings: "PONG <nonce> <token> <uptime_ms> <digest>".
//
// Before the first answer of a new nonce series it does the resume work
// and keeps the digest that work returns. A series is the nonce up to its
// last '-' (a nonce without one is a series of its own). Each host-side
// connection draws a random series prefix, and a restore is a new QEMU
// with a new connection, so the first ping after a resume always opens a
// series. The guest's clock gives no such signal: it carries on from the
// snapshot, and under emulation its jumps depend on the host's load. At
// boot the first ping opens a series too, so the digest the captured guest
// reported was computed by the same code on the same state.
type responder struct {
	token  string
	uptime func() time.Duration
	// resume does the resume work and returns the state's digest.
	resume func() (string, error)
	// logf reports a failed resume; the answer then carries digest "-".
	logf func(format string, args ...any)

	series string // series of the last answered ping
	digest string // "" until the first resume
}

func (r *responder) answer(nonce string) string {
	if s := nonceSeries(nonce); s != r.series || r.digest == "" {
		r.series = s
		d, err := r.resume()
		if err != nil {
			r.logf("resume work: %v", err)
			d = "-"
		}
		r.digest = d
	}
	return fmt.Sprintf("PONG %s %s %d %s\n", nonce, r.token, r.uptime().Milliseconds(), r.digest)
}

// nonceSeries is the part of a nonce that names its sender's series.
func nonceSeries(nonce string) string {
	if i := strings.LastIndexByte(nonce, '-'); i >= 0 {
		return nonce[:i]
	}
	return nonce
}

// serve answers health pings read from rw until reading or writing fails.
// A line "PING <nonce>" is answered by r; every other line is ignored so
// that console noise, echoes and partial lines cannot confuse the host.
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
		nonce, ok := parsePing(line)
		if !ok {
			continue
		}
		if _, err := io.WriteString(rw, r.answer(nonce)); err != nil {
			return fmt.Errorf("write reply: %w", err)
		}
	}
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
	nonce := line[len(prefix):]
	if len(nonce) > maxNonceBytes {
		return "", false
	}
	for _, c := range nonce {
		if !isNonceByte(c) {
			return "", false
		}
	}
	return string(nonce), true
}

func isNonceByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_'
}
