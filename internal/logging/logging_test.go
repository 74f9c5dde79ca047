package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
)

func TestFormatsAndLevels(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, config.LogConfig{Format: config.LogFormatJSON, Level: config.LogLevelWarn})
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "restore", "r1")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("JSON log line %q: %v", buf.String(), err)
	}
	if line["msg"] != "shown" || line["restore"] != "r1" || line["level"] != "WARN" {
		t.Fatalf("line = %v", line)
	}

	buf.Reset()
	log, err = New(&buf, config.LogConfig{Format: config.LogFormatText, Level: config.LogLevelDebug})
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("detail", "k", 1)
	if got := buf.String(); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "k=1") {
		t.Fatalf("text line %q", got)
	}
}

func TestUnknownValuesNameTheKey(t *testing.T) {
	for _, c := range []struct {
		cfg config.LogConfig
		key string
	}{
		{config.LogConfig{Format: "xml", Level: "info"}, "log.format"},
		{config.LogConfig{Format: "text", Level: "loud"}, "log.level"},
	} {
		if _, err := New(&bytes.Buffer{}, c.cfg); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("New(%+v) = %v, want an error naming %s", c.cfg, err, c.key)
		}
	}
}

// TestJSONDurationsAreNanosecondsInKeysEndingNs: the JSON log follows the
// JSON convention (docs/json.md), in groups too; the text log keeps Go's
// duration strings.
func TestJSONDurationsAreNanosecondsInKeysEndingNs(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, config.LogConfig{Format: config.LogFormatJSON})
	if err != nil {
		t.Fatal(err)
	}
	log.Info("stopped", "duration", 115673*time.Nanosecond, "ready_ns", 2*time.Millisecond,
		slog.Group("stop", slog.Duration("drain", time.Microsecond)))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("JSON log line %q: %v", buf.String(), err)
	}
	stop, _ := line["stop"].(map[string]any)
	if line["duration_ns"] != float64(115673) || line["ready_ns"] != float64(2e6) || stop["drain_ns"] != float64(1000) {
		t.Errorf("line %s: want duration_ns 115673, ready_ns 2000000, stop.drain_ns 1000", buf.Bytes())
	}
	if _, ok := line["duration"]; ok {
		t.Errorf("line %s keeps a duration without its unit", buf.Bytes())
	}

	buf.Reset()
	if log, err = New(&buf, config.LogConfig{Format: config.LogFormatText}); err != nil {
		t.Fatal(err)
	}
	log.Info("stopped", "duration", 115673*time.Nanosecond)
	if got := buf.String(); !strings.Contains(got, "duration=115.673µs") {
		t.Errorf("text line %q", got)
	}
}
