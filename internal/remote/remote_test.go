package remote

import (
	"strings"
	"testing"

	"warmstart/internal/config"
)

// --daemon takes a socket path or an http(s) URL; another scheme is an
// error naming what it wants, not a socket path that does not exist.
func TestDialRefusesOtherSchemes(t *testing.T) {
	noConfig := func() (*config.Config, error) { return config.Default(), nil }
	if _, err := Dial("ftp://host:21", noConfig); err == nil || !strings.Contains(err.Error(), "want the path of a Unix socket") {
		t.Errorf("ftp://host:21: %v", err)
	}
	c, err := Dial("/run/warmstart/warmstart.sock", noConfig)
	if err != nil {
		t.Fatalf("a socket path: %v", err)
	}
	c.Close()
}
