package fusedev

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"
)

// libraryLogger is the *log.Logger the FUSE library prints to: each line
// becomes a record of l (slog.Default() when nil) with component=fuse.
// The library's default is the standard logger, whose raw lines would
// reach stderr outside the operator's log format and level.
func libraryLogger(l *slog.Logger) *log.Logger {
	if l == nil {
		l = slog.Default()
	}
	return log.New(&libraryLog{l: l.With("component", "fuse")}, "", 0)
}

// libraryLog turns the library's lines into records.
type libraryLog struct{ l *slog.Logger }

func (w *libraryLog) Write(p []byte) (int, error) {
	for line := range bytes.Lines(p) {
		msg := strings.TrimSpace(string(line))
		if msg != "" {
			w.l.Log(context.Background(), libraryLevel(msg), msg)
		}
	}
	return len(p), nil
}

// libraryLevel is the level of one library line. Most are the request
// trace (with Debug) or a reply to a request the kernel stopped waiting
// for, which is routine when a VM is killed mid-fault: DEBUG. A failed
// read of the FUSE device means the mount is in trouble: WARN. The
// library has no levels of its own, so this goes by its wording.
func libraryLevel(msg string) slog.Level {
	if strings.HasPrefix(msg, "Failed to read from fuse conn") {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}
