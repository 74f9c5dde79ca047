package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"
)

// maxLineBytes bounds one request line. A longer line is garbage (line noise
// or a partial line left over from before a snapshot) and is skipped whole.
const maxLineBytes = 256

// maxNonceBytes bounds the nonce the host sends with each ping.
const maxNonceBytes = 64

// serve answers health pings read from rw until reading or writing fails.
// A line "PING <nonce>" is answered "PONG <nonce> <token> <uptime_ms>";
// every other line is ignored so that console noise, echoes and partial
// lines cannot confuse the host.
func serve(rw io.ReadWriter, token string, uptime func() time.Duration) error {
	r := bufio.NewReaderSize(rw, maxLineBytes)
	skipping := false // inside an over-long line, until its newline
	for {
		line, err := r.ReadSlice('\n')
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
		reply := fmt.Sprintf("PONG %s %s %d\n", nonce, token, uptime().Milliseconds())
		if _, err := io.WriteString(rw, reply); err != nil {
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
