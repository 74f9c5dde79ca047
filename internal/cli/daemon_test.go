package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// Every form a daemon's address is written in reaches the endpoint
// api.Dial takes; HOST:PORT is TCP unless a file has that name.
func TestDaemonAddressForms(t *testing.T) {
	dir := t.TempDir()
	sockLike := filepath.Join(dir, "host:1")
	if err := os.WriteFile(sockLike, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for in, want := range map[string]string{
		"unix:/run/ws/d.sock":     "/run/ws/d.sock",
		"/run/ws/d.sock":          "/run/ws/d.sock",
		"d.sock":                  "d.sock",
		"127.0.0.1:18777":         "http://127.0.0.1:18777",
		"localhost:80":            "http://localhost:80",
		"[::1]:18777":             "http://[::1]:18777",
		"http://127.0.0.1:18777":  "http://127.0.0.1:18777",
		"https://ws.example:8443": "https://ws.example:8443",
		"host:1":                  "host:1", // a file of that name is here
	} {
		got, err := DaemonAddress(in)
		if err != nil || got != want {
			t.Errorf("DaemonAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	// HOST:PORT with a port no TCP address has, and no file of that name:
	// a typo, not a socket path whose dial fails with "no such file".
	for _, bad := range []string{"unix:", "ftp://x", "https://", "127.0.0.1:99999", "localhost:0"} {
		if got, err := DaemonAddress(bad); err == nil {
			t.Errorf("DaemonAddress(%q) = %q, want an error", bad, got)
		}
	}
}
