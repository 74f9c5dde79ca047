package trust_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/trust"
	"warmstart/internal/untrusted"
)

func generate(t *testing.T) (trust.Key, string) {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "publisher")
	k, err := trust.GenerateFiles(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return k, prefix
}

func TestGenerateWritesAPrivateAndAPublicFile(t *testing.T) {
	k, prefix := generate(t)
	for _, c := range []struct {
		path string
		mode os.FileMode
		head string
	}{{prefix + ".key", 0o600, "-----BEGIN PRIVATE KEY-----"}, {prefix + ".pub", 0o644, "-----BEGIN PUBLIC KEY-----"}} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(c.path)
		if fi.Mode().Perm() != c.mode || !strings.HasPrefix(string(data), c.head) {
			t.Errorf("%s: mode %v, starts %q; want %v, %q", c.path, fi.Mode().Perm(), data[:min(len(data), 30)], c.mode, c.head)
		}
	}
	priv, err := trust.LoadPrivate(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := trust.LoadPublic(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if priv.ID() != k.ID() || pub.ID() != k.ID() || len(k.ID()) != 16 || pub.Private != nil {
		t.Fatalf("ids %s, %s, %s; the public file gave a private key: %v", k.ID(), priv.ID(), pub.ID(), pub.Private != nil)
	}
	if _, err := trust.GenerateFiles(prefix); !errors.Is(err, os.ErrExist) {
		t.Fatalf("generate over existing files: %v, want ErrExist", err)
	}
	if again, _ := trust.LoadPublic(prefix + ".pub"); again.ID() != k.ID() {
		t.Fatal("a refused generate changed the key")
	}
}

func TestGenerateRefusesWhenEitherFileExists(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(prefix+".pub", []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.GenerateFiles(prefix); !errors.Is(err, os.ErrExist) {
		t.Fatalf("generate with PREFIX.pub there: %v, want ErrExist", err)
	}
	if _, err := os.Stat(prefix + ".key"); !os.IsNotExist(err) {
		t.Fatalf("a refused generate wrote the private key: %v", err)
	}
}

func TestKeyFilesOpenToOthersAreRefused(t *testing.T) {
	_, prefix := generate(t)
	for _, c := range []struct {
		path    string
		mode    os.FileMode
		load    func(string) (trust.Key, error)
		refused bool
	}{
		{prefix + ".key", 0o640, trust.LoadPrivate, true},
		{prefix + ".key", 0o604, trust.LoadPrivate, true},
		{prefix + ".key", 0o400, trust.LoadPrivate, false},
		{prefix + ".pub", 0o664, trust.LoadPublic, true},
		{prefix + ".pub", 0o646, trust.LoadPublic, true},
		{prefix + ".pub", 0o444, trust.LoadPublic, false},
		// A public key read from the private file checks it as private.
		{prefix + ".key", 0o644, trust.LoadPublic, true},
	} {
		if err := os.Chmod(c.path, c.mode); err != nil {
			t.Fatal(err)
		}
		_, err := c.load(c.path)
		if refused := errors.Is(err, trust.ErrKeyFileOpen); refused != c.refused {
			t.Errorf("%s mode %04o: %v; want refused %v", filepath.Base(c.path), c.mode, err, c.refused)
		}
		os.Chmod(c.path, 0o600)
	}
	link := filepath.Join(t.TempDir(), "link.pub")
	if err := os.Symlink(prefix+".pub", link); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.LoadPublic(link); err != nil {
		t.Errorf("a symlink to a good key file (as secret mounts make): %v", err)
	}
	garbage := filepath.Join(t.TempDir(), "garbage.pub")
	os.WriteFile(garbage, []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"), 0o644)
	if _, err := trust.LoadPublic(garbage); err == nil {
		t.Error("a file that holds no key loaded")
	}
}

// signedRecord is a valid record of format 2 with a SHA-256 table,
// signed by signers.
func signedRecord(t *testing.T, signers ...trust.Key) repository.Record {
	t.Helper()
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	tables := repository.DigestTables{CRC: repotest.DigestTable(t, in.MemoryPath), SHA256: repotest.SHA256DigestTable(t, in.MemoryPath)}
	rec := repository.NewRecord("0192d3a4-5b6c-7d8e-9f00-112233445566", in.Request("web"),
		repository.StoredArtifact{Size: in.VMStateSize, SHA256: in.VMStateSHA256},
		repository.StoredArtifact{Size: in.MemorySize, SHA256: in.MemorySHA256}, tables)
	for _, k := range signers {
		var err error
		if rec, err = repository.SignRecord(rec, k.Private); err != nil {
			t.Fatal(err)
		}
	}
	return rec
}

func TestPolicyChecksSignaturesOfTrustedKeysOnly(t *testing.T) {
	publisher, _ := generate(t)
	stranger, _ := generate(t)
	policy := trust.NewPolicy(trust.Key{Public: publisher.Public})
	changed := signedRecord(t, publisher)
	changed.MemorySHA256 = strings.Repeat("0", 64)
	noSHA256 := signedRecord(t, publisher)
	noSHA256.MemorySHA256Digests = nil
	noTable := signedRecord(t, publisher)
	noTable.MemoryDigests = nil
	for _, c := range []struct {
		name   string
		rec    repository.Record
		reason string // "" when served
	}{
		{"signed by the publisher", signedRecord(t, publisher), ""},
		{"signed by a stranger and the publisher", signedRecord(t, stranger, publisher), ""},
		{"unsigned", signedRecord(t), "unsigned"},
		{"signed by a stranger", signedRecord(t, stranger), "not trust (" + stranger.ID() + ")"},
		{"changed after signing", changed, "changed after it was signed by trusted key " + publisher.ID()},
		{"no table of SHA-256 digests", noSHA256, "no table of SHA-256 digests"},
		{"no CRC-32C table", noTable, "changed after it was signed"},
	} {
		err := policy.Check(c.rec)
		st := policy.Status(c.rec)
		var re *trust.RefusedError
		switch {
		case c.reason == "" && (err != nil || st.State != trust.StateVerified || st.Key != publisher.ID()):
			t.Errorf("%s: check %v, status %+v; want served, verified by %s", c.name, err, st, publisher.ID())
		case c.reason != "" && (!errors.As(err, &re) || !errors.Is(err, trust.ErrUntrusted) || re.Snapshot != c.rec.ID ||
			!strings.Contains(err.Error(), c.reason) || st.State != trust.StateRefused):
			t.Errorf("%s: check %v, status %+v; want refused naming %s and %q", c.name, err, st, c.rec.ID, c.reason)
		}
	}
}

func TestPolicyWithoutKeysChecksNothingAndSaysSo(t *testing.T) {
	publisher, _ := generate(t)
	for _, p := range []*trust.Policy{nil, trust.NewPolicy()} {
		unsigned, signed := signedRecord(t), signedRecord(t, publisher)
		if p.Check(unsigned) != nil || p.Enforcing() {
			t.Fatal("a policy without keys refused a record")
		}
		st := p.Status(signed)
		if st.State != trust.StateUnverified || len(st.SignedBy) != 1 || st.SignedBy[0] != publisher.ID() ||
			!strings.Contains(st.Line(), "unverified") || !strings.Contains(st.Line(), "signed by key "+publisher.ID()) {
			t.Fatalf("status of a signed record on a node without keys: %+v (%s)", st, st.Line())
		}
	}
}

func TestLoadPolicyTrustsTheNodesOwnKeyWithOthers(t *testing.T) {
	publisher, pubPrefix := generate(t)
	own, _ := generate(t)
	p, err := trust.LoadPolicy([]string{pubPrefix + ".pub"}, &own)
	if err != nil {
		t.Fatal(err)
	}
	if ids := p.KeyIDs(); len(ids) != 2 || p.Check(signedRecord(t, own)) != nil || p.Check(signedRecord(t, publisher)) != nil {
		t.Fatalf("trusted %v", ids)
	}
	if p, err := trust.LoadPolicy(nil, &own); err != nil || p.Enforcing() {
		t.Fatalf("a node with a signing key and no trusted keys enforces: %v", err)
	}
}

// A key path that names no regular file is refused for what it is, not
// for its mode: "chmod 600 it" would not make a directory a key. And
// every refusal names the path the configuration gave, a symlink loop's
// too, so the operator knows which file to fix.
func TestKeyFilesThatAreNoRegularFileAreNamedForWhatTheyAre(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "keys")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(dir, "loop1")
	os.Symlink(filepath.Join(dir, "loop2"), loop)
	os.Symlink(loop, filepath.Join(dir, "loop2"))
	loads := map[string]func(string) (trust.Key, error){
		"private": func(p string) (trust.Key, error) { return trust.LoadPrivate(p) },
		"public":  func(p string) (trust.Key, error) { return trust.LoadPublic(p) },
	}
	for name, load := range loads {
		_, err := load(open)
		if !errors.Is(err, untrusted.ErrNotRegular) || errors.Is(err, trust.ErrKeyFileOpen) ||
			!strings.Contains(err.Error(), open) || !strings.Contains(err.Error(), "directory") {
			t.Errorf("%s key that is a directory of mode 0755: %v; want not a regular file, a directory, naming %s",
				name, err, open)
		}
		if _, err := load(loop); err == nil || !strings.Contains(err.Error(), loop) {
			t.Errorf("%s key that is a symlink loop: %v; want an error naming %s", name, err, loop)
		}
	}
}
