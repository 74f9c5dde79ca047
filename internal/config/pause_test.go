package config

import (
	"testing"

	"warmstart/internal/pause"
	"warmstart/internal/repository"
)

func TestPauseMaxDepth(t *testing.T) {
	if d := Default().Pause.MaxDepth; d != pause.DefaultMaxDepth || MaxPauseDepth != repository.MaxDepth {
		t.Fatalf("[pause] max_depth defaults to %d within 1..%d; want the pause package's %d within 1..%d",
			d, MaxPauseDepth, pause.DefaultMaxDepth, repository.MaxDepth)
	}
	cfg, err := Parse([]byte("[pause]\nmax_depth = 3"), "/etc/warmstart/test.toml")
	if err != nil || cfg.Pause.MaxDepth != 3 {
		t.Fatalf("max_depth = 3: %+v, %v", cfg.Pause, err)
	}
	for _, tc := range []struct{ text, message string }{
		{"[pause]\nmax_depth = 0", "0 out of range 1..127"},
		{"[pause]\nmax_depth = -1", "-1 out of range 1..127"},
		{"[pause]\nmax_depth = 128", "128 out of range 1..127"},
	} {
		checkConfigError(t, tc.text, "pause.max_depth", ErrInvalidValue, tc.message)
	}
	checkConfigError(t, "[pause]\nmax_depth = \"deep\"", "pause.max_depth", ErrWrongType, "")
	checkConfigError(t, "[pause]\nmax_dept = 3", "pause.max_dept", ErrUnknownKey, "did you mean pause.max_depth?")
}
