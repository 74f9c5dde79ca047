package api

import (
	"fmt"
	"os"
	"strings"

	"warmstart/internal/untrusted"
)

// TokenEnv names the environment variable that carries the API token of a
// daemon serving TCP, ahead of the token file.
const TokenEnv = "WARMSTART_TOKEN"

// maxTokenFileBytes bounds a token file read.
const maxTokenFileBytes = 4096

// ReadToken reads a token file: one line of hex, at most 4 KiB.
func ReadToken(path string) (string, error) {
	data, err := untrusted.ReadBounded(path, maxTokenFileBytes)
	if err != nil {
		return "", fmt.Errorf("daemon token: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("daemon token: %s is empty", path)
	}
	return token, nil
}

// Dial returns a client for the daemon at endpoint: the path of its Unix
// socket, or http(s)://host:port, which needs the API token:
// WARMSTART_TOKEN, else the file tokenFile names ([daemon] token_file),
// asked for only then.
func Dial(endpoint string, tokenFile func() (string, error)) (*Client, error) {
	web := strings.HasPrefix(endpoint, "http://") || strings.HasPrefix(endpoint, "https://")
	if !web && strings.Contains(endpoint, "://") {
		// Not a path anyone means: dialled as a socket, it would fail as
		// a missing file.
		return nil, fmt.Errorf("%q: want the path of a Unix socket or http(s)://host:port", endpoint)
	}
	c := NewClient(endpoint)
	if !web {
		return c, nil // the socket is mode 0600: reaching it is authentication
	}
	token, err := token(tokenFile)
	if err != nil {
		return nil, err
	}
	return c.WithToken(token), nil
}

// token is the bearer token for a daemon serving TCP.
func token(tokenFile func() (string, error)) (string, error) {
	if t := strings.TrimSpace(os.Getenv(TokenEnv)); t != "" {
		return t, nil
	}
	path, err := tokenFile()
	if err != nil {
		return "", err
	}
	t, err := ReadToken(path)
	if err != nil {
		return "", fmt.Errorf("no API token: set %s or make %s readable (`warmstart serve --listen` on a loopback address creates it): %w",
			TokenEnv, path, err)
	}
	return t, nil
}
