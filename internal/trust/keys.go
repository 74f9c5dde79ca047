package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"warmstart/internal/durable"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// Key files. A private key is PEM "PRIVATE KEY" holding PKCS #8 (RFC
// 5208, Ed25519 as RFC 8410 has it), a public key PEM "PUBLIC KEY"
// holding PKIX (SubjectPublicKeyInfo): what `openssl genpkey -algorithm
// ed25519` and `openssl pkey -pubout` read and write, so keys can be made,
// inspected and kept with common tools.
const (
	// PrivateSuffix and PublicSuffix are the names GenerateFiles gives
	// the two files after its prefix.
	PrivateSuffix = ".key"
	PublicSuffix  = ".pub"

	pemPrivate = "PRIVATE KEY"
	pemPublic  = "PUBLIC KEY"

	// maxKeyFileBytes bounds a key file read: a PEM Ed25519 key is about
	// 120 bytes.
	maxKeyFileBytes = 16 << 10
)

// GenerateFiles makes a fresh key pair and writes prefix+PrivateSuffix
// (mode 0600) and prefix+PublicSuffix (mode 0644), each durably (a
// temporary file, fsync, a link to its name, fsync of the directory).
// It never replaces a file: when either exists it fails before writing
// anything, and a file another process makes meanwhile wins.
func GenerateFiles(prefix string) (Key, error) {
	priv, pub := prefix+PrivateSuffix, prefix+PublicSuffix
	for _, p := range []string{priv, pub} {
		if _, err := os.Lstat(p); err == nil {
			return Key{}, fmt.Errorf("key generate: %s exists: %w", p, os.ErrExist)
		} else if !errors.Is(err, os.ErrNotExist) {
			return Key{}, fmt.Errorf("key generate: %w", err)
		}
	}
	pubKey, privKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Key{}, fmt.Errorf("key generate: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(privKey)
	if err != nil {
		return Key{}, fmt.Errorf("key generate: %w", err)
	}
	pubPEM, err := encodePublic(pubKey)
	if err != nil {
		return Key{}, fmt.Errorf("key generate: %w", err)
	}
	if err := createFile(priv, pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: privDER}), 0o600); err != nil {
		return Key{}, fmt.Errorf("key generate: %w", err)
	}
	if err := createFile(pub, pubPEM, 0o644); err != nil {
		return Key{}, errors.Join(fmt.Errorf("key generate: %w", err), removeDurable(priv))
	}
	return Key{Public: pubKey, Private: privKey}, nil
}

func encodePublic(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublic, Bytes: der}), nil
}

// EncodePublic is pub as a public key file holds it (PEM PKIX).
func EncodePublic(pub ed25519.PublicKey) []byte {
	data, err := encodePublic(pub)
	if err != nil {
		panic(fmt.Sprintf("trust: encode an Ed25519 public key: %v", err)) // x509 encodes every Ed25519 key
	}
	return data
}

// createFile writes data to a new file at path with mode, durably, and
// fails if path exists.
func createFile(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".key-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		// Link, not rename: never replace a file that appeared meanwhile.
		err = os.Link(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return durable.Sync(dir)
}

func removeDurable(path string) error {
	if err := os.Remove(path); err != nil {
		return err
	}
	return durable.Sync(filepath.Dir(path))
}

// Key is a key pair read from files; Private is nil when only the public
// key was read.
type Key struct {
	Public  ed25519.PublicKey
	Private ed25519.PrivateKey
}

// CheckPrefix refuses a key file prefix (GenerateFiles') that names a
// directory: its files would be hidden ones in it (DIR/.key) or land
// beside it (DIR.key).
func CheckPrefix(prefix string) error {
	base := filepath.Base(prefix)
	fi, err := os.Stat(prefix)
	if strings.HasSuffix(prefix, "/") || base == "." || base == ".." || (err == nil && fi.IsDir()) {
		return fmt.Errorf("%s names a directory; give the key a name in it, such as %s",
			prefix, filepath.Join(prefix, "publisher"))
	}
	return nil
}

// ID is the key's id (repository.KeyID).
func (k Key) ID() string { return repository.KeyID(k.Public) }

// LoadPrivate reads a private key file. The file must keep the key
// secret as the daemon's token file must: a regular file (symlinks are
// followed, for secret mounts that link their files), owned by this
// process's user or root, with no permission for group or others.
func LoadPrivate(path string) (Key, error) {
	data, err := readKeyFile(path, true)
	if err != nil {
		return Key{}, err
	}
	priv, err := parseKey[ed25519.PrivateKey](data, pemPrivate, x509.ParsePKCS8PrivateKey)
	if err != nil {
		return Key{}, fmt.Errorf("signing key %s: %w", path, err)
	}
	return Key{Public: priv.Public().(ed25519.PublicKey), Private: priv}, nil
}

// LoadPublic reads a public key file, or the public half of a private
// one. A public key is no secret, but whoever can change the file
// chooses which signatures a node trusts: it must be a regular file
// (symlinks followed) owned by this process's user or root that neither
// group nor others can write.
func LoadPublic(path string) (Key, error) {
	data, err := readKeyFile(path, false)
	if err != nil {
		return Key{}, err
	}
	if block, _ := pem.Decode(data); block != nil && block.Type == pemPrivate {
		return LoadPrivate(path)
	}
	pub, err := parseKey[ed25519.PublicKey](data, pemPublic, x509.ParsePKIXPublicKey)
	if err != nil {
		return Key{}, fmt.Errorf("trusted key %s: %w", path, err)
	}
	return Key{Public: pub}, nil
}

// parseKey decodes data, one PEM block of pemType, with parse, and wants
// an Ed25519 key of type K.
func parseKey[K any](data []byte, pemType string, parse func([]byte) (any, error)) (K, error) {
	var none K
	block, rest := pem.Decode(data)
	if block == nil || block.Type != pemType || len(bytes.TrimSpace(rest)) > 0 {
		return none, fmt.Errorf("not one PEM %q block", pemType)
	}
	parsed, err := parse(block.Bytes)
	if err != nil {
		return none, err
	}
	k, ok := parsed.(K)
	if !ok {
		return none, fmt.Errorf("a %T, not an Ed25519 key", parsed)
	}
	return k, nil
}

// readKeyFile checks a key file's owner and mode and reads it.
func readKeyFile(path string, secret bool) ([]byte, error) {
	what := "trusted key"
	if secret {
		what = "signing key"
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if err := checkKeyFile(resolved, secret); err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	data, err := untrusted.ReadBounded(resolved, maxKeyFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return data, nil
}

// ErrKeyFileOpen is what a key file others can read (a private key) or
// change (any key) wraps.
var ErrKeyFileOpen = errors.New("key file is open to others")

// checkKeyFile refuses a key file owned by another user than this
// process's or root, and one group or others can read (a private key) or
// write (any key). What is no regular file is refused for that first: no
// mode would make a directory or a device a key.
func checkKeyFile(path string, secret bool) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: it is a %s", untrusted.ErrNotRegular, untrusted.KindOf(fi.Mode()))
	}
	mode := os.FileMode(st.Mode).Perm()
	switch {
	case secret && mode&0o077 != 0:
		return fmt.Errorf("%w: mode %04o lets group or others at the private key: chmod 600 it", ErrKeyFileOpen, mode)
	case mode&0o022 != 0:
		return fmt.Errorf("%w: mode %04o lets group or others change it: chmod go-w it", ErrKeyFileOpen, mode)
	case int(st.Uid) != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%w: owned by uid %d, not by this process's user or root", ErrKeyFileOpen, st.Uid)
	}
	return nil
}
