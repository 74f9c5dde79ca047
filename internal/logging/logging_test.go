package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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
