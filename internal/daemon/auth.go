package daemon

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/durable"
)

// The TCP API is reachable by every local user (and, off loopback, by the
// network), so it answers only requests that carry the daemon's bearer
// token; the Unix socket is mode 0600, so reaching it is authentication
// enough.

// tokenBytes is the token's entropy; it is stored hex-encoded.
const tokenBytes = 32

// ErrNoToken is returned when a non-loopback address is to be served
// without a configured token file.
var ErrNoToken = errors.New("serving TCP off loopback needs [daemon] token_file")

// serveToken returns the token TCP clients must present at addr, creating
// the token file when it does not exist. A non-loopback address needs the
// file named in the configuration: a token the operator never chose the
// place of is not one they will distribute with care.
func serveToken(cfg *config.Config, addr string) (token, path string, created bool, err error) {
	if cfg.Daemon.TokenFile == "" && !isLoopback(addr) {
		return "", "", false, fmt.Errorf("daemon: listen %s: %w", addr, ErrNoToken)
	}
	path = cfg.DaemonTokenFile()
	token, err = api.ReadToken(path)
	if err == nil {
		return token, path, false, checkServedToken(path, token)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", "", false, err
	}
	token, err = createToken(path)
	return token, path, err == nil, err
}

// minTokenChars is the shortest token a daemon serves with: a token
// anyone can guess is no authentication (the daemon's own have 64).
const minTokenChars = 16

// checkServedToken refuses a token file that does not keep the token
// secret (any mode bit of group or others set, owned by another user
// than the daemon's or root), a token short enough to guess, and one no
// client can send: every local user can reach the TCP API, so anyone who
// can read or change the token is a client.
func checkServedToken(path, token string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("daemon token: %w", err)
	}
	if mode := os.FileMode(st.Mode).Perm(); mode&0o077 != 0 {
		return fmt.Errorf("daemon token: %s is open to group or others (mode %04o): chmod 600 it", path, mode)
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("daemon token: %s is owned by uid %d, not by the daemon's user or root", path, uid)
	}
	if n := len(token); n < minTokenChars {
		return fmt.Errorf("daemon token: %s holds a token of %d characters: want at least %d", path, n, minTokenChars)
	}
	// A client sends it in an HTTP header, which cannot carry a space,
	// a control byte or anything beyond ASCII: such a token would lock
	// every client out.
	if i := strings.IndexFunc(token, func(r rune) bool { return r <= ' ' || r > '~' }); i >= 0 {
		return fmt.Errorf("daemon token: %s holds a character a header cannot carry (byte %d): want printable ASCII without spaces", path, i)
	}
	return nil
}

// createToken writes a fresh random token to path, mode 0600, durably.
func createToken(path string) (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("daemon token: %w", err)
	}
	token := hex.EncodeToString(b)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("daemon token: %w", err)
	}
	f, err := os.CreateTemp(dir, ".token-*")
	if err != nil {
		return "", fmt.Errorf("daemon token: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(token + "\n")
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		// Link, not rename: never replace a token another daemon just made.
		err = os.Link(f.Name(), path)
	}
	if err == nil {
		err = durable.Sync(dir)
	}
	if err != nil {
		return "", fmt.Errorf("daemon token %s: %w", path, err)
	}
	return token, nil
}

// isLoopback reports whether host:port names a loopback address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// requireToken answers 401 to a request without the bearer token. The
// scheme's name is case-insensitive (RFC 9110, 11.1): clients send
// "bearer" as well as "Bearer".
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="warmstart"`)
			writeJSON(w, http.StatusUnauthorized, api.Error{Error: "missing or wrong bearer token (see [daemon] token_file)"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
