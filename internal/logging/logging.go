// Package logging builds the structured logger the daemon and the CLI
// write to stderr, as [log] configures it.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"warmstart/internal/config"
)

// New returns a logger writing to w in the format and from the level of c.
// c is expected to be validated; an unknown value is still an error
// naming the key, never a silent default.
func New(w io.Writer, c config.LogConfig) (*slog.Logger, error) {
	var level slog.Level
	switch c.Level {
	case config.LogLevelDebug:
		level = slog.LevelDebug
	case config.LogLevelInfo, "":
		level = slog.LevelInfo
	case config.LogLevelWarn:
		level = slog.LevelWarn
	case config.LogLevelError:
		level = slog.LevelError
	default:
		return nil, fmt.Errorf("log.level: %q is not one of debug, info, warn, error", c.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.Format {
	case config.LogFormatText, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case config.LogFormatJSON:
		opts.ReplaceAttr = durationNanos
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log.format: %q is not one of text, json", c.Format)
}

// durationNanos writes a duration as the JSON convention has it
// (docs/json.md): an integer of nanoseconds under a key ending in _ns, so
// "duration" becomes "duration_ns". slog's JSON handler would write the
// integer under the bare key, its unit nowhere.
func durationNanos(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	key := a.Key
	if !strings.HasSuffix(key, "_ns") {
		key += "_ns"
	}
	return slog.Int64(key, int64(a.Value.Duration()))
}
