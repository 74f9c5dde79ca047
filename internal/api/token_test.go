package api

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --daemon takes a socket path or an http(s) URL; another scheme is an
// error naming what it wants, not a socket path that does not exist.
func TestDialRefusesOtherSchemes(t *testing.T) {
	noFile := func() (string, error) { return "", errors.New("token file asked for") }
	if _, err := Dial("ftp://host:21", noFile); err == nil || !strings.Contains(err.Error(), "want the path of a Unix socket") {
		t.Errorf("ftp://host:21: %v", err)
	}
	c, err := Dial("/run/warmstart/warmstart.sock", noFile)
	if err != nil {
		t.Fatalf("a socket path: %v", err)
	}
	c.Close()
}

// A TCP endpoint takes WARMSTART_TOKEN before the token file, and the
// file only when the variable is unset; a file that cannot be read is an
// error naming both ways to give a token.
func TestDialFindsTheTokenOfATCPEndpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	asked := 0
	file := func() (string, error) { asked++; return path, nil }

	t.Setenv(TokenEnv, "from-the-environment")
	c, err := Dial("http://127.0.0.1:1", file)
	if err != nil || c.token != "from-the-environment" || asked != 0 {
		t.Fatalf("with %s set: token %q, file asked %d times, err %v", TokenEnv, c.token, asked, err)
	}
	t.Setenv(TokenEnv, "")
	if c, err = Dial("http://127.0.0.1:1", file); err != nil || c.token != "0123456789abcdef0123" {
		t.Fatalf("from the file: token %q, err %v", c.token, err)
	}
	missing := func() (string, error) { return filepath.Join(t.TempDir(), "none"), nil }
	if _, err := Dial("http://127.0.0.1:1", missing); err == nil || !strings.Contains(err.Error(), TokenEnv) {
		t.Fatalf("without a token: %v", err)
	}
}
