package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/cli"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/trust"
)

// withTrust appends a [trust] table to root's configuration, as a copy
// at a new path, and returns that path.
func withTrust(t *testing.T, root cliRoot, name, table string) string {
	t.Helper()
	base, err := os.ReadFile(root.cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root.dir, name+".toml")
	if err := os.WriteFile(path, append(base, []byte("[trust]\n"+table+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// showTrust is `snapshot show --json`'s trust of ref under cfg.
func showTrust(t *testing.T, cfg, ref string) trust.Status {
	t.Helper()
	r := runCLI(t, "--config", cfg, "snapshot", "show", ref, "--json")
	var out struct {
		Trust trust.Status `json:"trust"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
		t.Fatalf("snapshot show %s: exit %d, stdout %q, stderr %q", ref, r.code, r.stdout, r.stderr)
	}
	return out.Trust
}

// The publisher's story from the command line: generate keys, publish
// signed, a node trusting the key restores, one trusting another key
// refuses with exit 3, and `snapshot sign` adds the second key's
// signature (the rotation), after which that node restores too.
func TestSigningFromTheCommandLine(t *testing.T) {
	root := newCLIRoot(t, "wstrust-", 11)
	keys := filepath.Join(root.dir, "keys")
	must(t, os.Mkdir(keys, 0o700))
	r := runCLI(t, "key", "generate", "--out", filepath.Join(keys, "old"))
	if r.code != 0 || !strings.Contains(r.stdout, "old.key") {
		t.Fatalf("key generate: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, "key", "generate", "--out", filepath.Join(keys, "old")); r.code != 1 || !strings.Contains(r.stderr, "exists") {
		t.Fatalf("key generate over an existing key: exit %d, %q", r.code, r.stderr)
	}
	runCLI(t, "key", "generate", "--out", filepath.Join(keys, "new"))
	oldKey, err := trust.LoadPublic(filepath.Join(keys, "old.pub"))
	must(t, err)
	newKey, err := trust.LoadPublic(filepath.Join(keys, "new.pub"))
	must(t, err)
	if r := runCLI(t, "key", "show", filepath.Join(keys, "old.key")); r.code != 0 || !strings.Contains(r.stdout, oldKey.ID()) ||
		!strings.Contains(r.stdout, "BEGIN PUBLIC KEY") {
		t.Fatalf("key show: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}

	publisher := withTrust(t, root, "publisher", fmt.Sprintf("signing_key = %q", filepath.Join(keys, "old.key")))
	trustsOld := withTrust(t, root, "old", fmt.Sprintf("trusted_keys = [%q]", filepath.Join(keys, "old.pub")))
	trustsNew := withTrust(t, root, "new", fmt.Sprintf("trusted_keys = [%q]", filepath.Join(keys, "new.pub")))
	rotated := withTrust(t, root, "rotated", fmt.Sprintf("signing_key = %q\ntrusted_keys = [%q]",
		filepath.Join(keys, "new.key"), filepath.Join(keys, "old.pub")))
	r = runCLI(t, "--config", publisher, "snapshot", "import", "--vm-state", root.ref.VMState, "--memory", root.ref.Memory,
		"--alias", "web", "--layout", root.layout)
	if r.code != 0 {
		t.Fatalf("import: exit %d, %q", r.code, r.stderr)
	}
	if st := showTrust(t, root.cfg, "web"); st.State != trust.StateUnverified || strings.Join(st.SignedBy, ",") != oldKey.ID() {
		t.Fatalf("show on a node without keys: %+v", st)
	}
	if st := showTrust(t, trustsOld, "web"); st.State != trust.StateVerified || st.Key != oldKey.ID() {
		t.Fatalf("show on a node trusting the publisher: %+v", st)
	}
	restore := func(cfg string) cliRun {
		return runCLI(t, "--config", cfg, "restore", "web", "--vmm", "replay", "--trace", root.ref.Trace)
	}
	if r := restore(trustsOld); r.code != 0 {
		t.Fatalf("restore on a node trusting the publisher: exit %d, %q", r.code, r.stderr)
	}
	if r := restore(trustsNew); r.code != cli.ExitUntrusted || !strings.Contains(r.stderr, "signed only by keys this node does not trust") {
		t.Fatalf("restore on a node trusting another key: exit %d, %q; want %d naming why", r.code, r.stderr, cli.ExitUntrusted)
	}
	// Rotation: the new key signs what the old one signed, at once.
	if r := runCLI(t, "--config", rotated, "snapshot", "sign", "web"); r.code != 0 || !strings.Contains(r.stdout, "already signed by trusted key "+oldKey.ID()) {
		t.Fatalf("snapshot sign: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if st := showTrust(t, trustsNew, "web"); st.State != trust.StateVerified || st.Key != newKey.ID() || len(st.SignedBy) != 2 {
		t.Fatalf("show after rotation on a node trusting the new key: %+v", st)
	}
	if r := restore(trustsNew); r.code != 0 {
		t.Fatalf("restore after rotation: exit %d, %q", r.code, r.stderr)
	}
}

// `snapshot sign` of a snapshot no trusted key vouches for reads it
// whole first, and refuses one whose memory no longer matches its record.
func TestSnapshotSignReadsWhatNoTrustedKeySigned(t *testing.T) {
	root := importedCLIRoot(t, "wssign-", 12, "web")
	keys := filepath.Join(root.dir, "keys")
	must(t, os.Mkdir(keys, 0o700))
	runCLI(t, "key", "generate", "--out", filepath.Join(keys, "k"))
	signer := withTrust(t, root, "signer", fmt.Sprintf("signing_key = %q", filepath.Join(keys, "k.key")))
	r := runCLI(t, "--config", signer, "snapshot", "sign", "web")
	if r.code != 0 || !strings.Contains(r.stdout, "read whole") || !strings.Contains(r.stderr, "memory.bin: verify") {
		t.Fatalf("sign of an unsigned snapshot: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, "--config", root.cfg, "snapshot", "import", "--vm-state", root.ref.VMState, "--memory", root.ref.Memory,
		"--alias", "damaged", "--layout", root.layout)
	if r.code != 0 {
		t.Fatalf("import: exit %d, %q", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	repotest.FlipBytes(t, filepath.Join(root.dir, "store", "snapshots", id, repository.MemoryFileName), 5000)
	if r := runCLI(t, "--config", signer, "snapshot", "sign", "damaged"); r.code != 1 || !strings.Contains(r.stderr, "finds problems") {
		t.Fatalf("sign of a snapshot whose memory changed: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if st := showTrust(t, root.cfg, "damaged"); len(st.SignedBy) != 0 {
		t.Fatalf("a damaged snapshot was signed: %+v", st)
	}
	if r := runCLI(t, "--config", root.cfg, "snapshot", "sign", "web"); r.code != 2 || !strings.Contains(r.stderr, "signing_key") {
		t.Fatalf("sign without a key: exit %d, %q", r.code, r.stderr)
	}
	if r := runCLI(t, "--config", signer, "snapshot", "sign", "web", "--daemon", "/nowhere.sock"); r.code != 2 {
		t.Fatalf("sign --daemon: exit %d, %q", r.code, r.stderr)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
