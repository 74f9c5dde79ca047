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

// libraryLevel is the level of one library line. The request trace (with
// Debug: lines of "rx N:" and "tx N:") and a reply the kernel no longer
// waits for (its request was interrupted, as when a VM is killed
// mid-fault: ENOENT) are routine: DEBUG. Anything else the library says
// on its own is about the mount's health (a failed device read, a request
// it could not parse): WARN. The library has no levels of its own, so
// this goes by its wording.
func libraryLevel(msg string) slog.Level {
	switch {
	case strings.HasPrefix(msg, "rx "), strings.HasPrefix(msg, "tx "):
		return slog.LevelDebug
	case strings.HasPrefix(msg, "writer: Write/Writev failed, err: 2=no such file or directory"):
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
