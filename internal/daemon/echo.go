package daemon

import (
	"fmt"
	"unicode/utf8"
)

// maxEchoBytes bounds how much of an error message an error body carries.
// Messages quote what the client sent (paths, layouts, field names), and a
// client must not be able to make the daemon answer with megabytes of its
// own input; bounding the whole message bounds every quotation in it. A
// kilobyte keeps whole the daemon's own errors, which name up to two full
// paths (a copy's source and destination), so an operator reads where it
// failed, not a cut in the middle of it.
const (
	maxEchoBytes      = 1024
	maxFieldEchoBytes = 64
)

// bounded returns msg if it fits in limit bytes, else its head and tail
// (limit/2 bytes each, cut at rune boundaries) around a note of how much
// was cut: the head says what was wrong and the tail usually why.
func bounded(msg string, limit int) string {
	if len(msg) <= limit {
		return msg
	}
	head, tail := msg[:limit/2], msg[len(msg)-limit/2:]
	for len(head) > 0 && !utf8.ValidString(head) {
		head = head[:len(head)-1]
	}
	for len(tail) > 0 && !utf8.ValidString(tail) {
		tail = tail[1:]
	}
	return fmt.Sprintf("%s…(%d bytes cut)…%s", head, len(msg)-len(head)-len(tail), tail)
}
