package config

import "testing"

func TestPackConcurrency(t *testing.T) {
	if d := Default().Backend.S3.PackConcurrency; d != 6 {
		t.Fatalf("backend.s3.pack_concurrency defaults to %d, want 6", d)
	}
	cfg, err := Parse([]byte("[backend.s3]\npack_concurrency = 12"), "/etc/warmstart/test.toml")
	if err != nil || cfg.Backend.S3.PackConcurrency != 12 {
		t.Fatalf("pack_concurrency = 12: %+v, %v", cfg.Backend.S3, err)
	}
	for _, tc := range []struct{ text, message string }{
		{"[backend.s3]\npack_concurrency = 0", "0 out of range 1..64"},
		{"[backend.s3]\npack_concurrency = 65", "65 out of range 1..64"},
	} {
		checkConfigError(t, tc.text, "backend.s3.pack_concurrency", ErrInvalidValue, tc.message)
	}
}
