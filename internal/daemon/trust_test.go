package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/api"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/trust"
)

// Two nodes, one bucket, one publisher key: A signs what it imports, B
// trusts A's public key and restores it. A writer of the bucket then
// swaps the VM state and rewrites the record to match: B refuses the
// restore with a 403 that names the snapshot and says its record changed
// after it was signed, and shows the snapshot as refused.
func TestMultiNodeTrustingNodeRefusesARewrittenRecord(t *testing.T) {
	c := newCluster(t)
	prefix := filepath.Join(c.f.dir, "publisher")
	key, err := trust.GenerateFiles(prefix)
	if err != nil {
		t.Fatal(err)
	}
	c.trust = map[string]string{
		"a": fmt.Sprintf("[trust]\nsigning_key = %q", prefix+trust.PrivateSuffix),
		"b": fmt.Sprintf("[trust]\ntrusted_keys = [%q]", prefix+trust.PublicSuffix),
	}
	a := c.start(t, "a", c.srv.Endpoint)
	b := c.start(t, "b", c.srv.Endpoint)
	ctx := context.Background()
	imp, err := a.client.Import(ctx, c.f.importRequest("signed"))
	if err != nil {
		t.Fatal(err)
	}
	wantTrust(t, b, "signed", trust.StateVerified, key.ID())
	id := c.restoreChecked(t, b, "signed")
	if _, err := b.client.StopRestore(ctx, id); err != nil {
		t.Fatal(err)
	}

	rewriteVMState(t, c.srv.Endpoint, imp.ID, []byte("a VM state of the attacker's"))
	_, err = b.client.Restore(ctx, api.RestoreRequest{Snapshot: "signed", Device: "file", Prefetch: "off"})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Field != "snapshot" || !errors.Is(err, trust.ErrUntrusted) ||
		!strings.Contains(ae.Message, imp.ID) || !strings.Contains(ae.Message, "changed after it was signed by trusted key "+key.ID()) {
		t.Fatalf("restore of the rewritten snapshot on B = %v; want a 403 on snapshot naming %s and the change", err, imp.ID)
	}
	wantTrust(t, b, "signed", trust.StateRefused, "")
}

// A daemon that trusts a key answers a restore of a snapshot that key did
// not sign with a 403 on the snapshot field, as the document says, and
// shows the snapshot as refused; the client's error matches
// trust.ErrUntrusted.
func TestRestoreOfAnUnsignedSnapshotIsA403(t *testing.T) {
	keyDir := t.TempDir()
	other, err := trust.GenerateFiles(filepath.Join(keyDir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{trust: fmt.Sprintf("[trust]\ntrusted_keys = [%q]", filepath.Join(keyDir, "other.pub"))})
	r := startDaemon(t, f, nil)
	imp := r.importAs(t, f, "unsigned")
	c := newAPICheck(t, r.d.Handler())
	if got := c.do("GET", "/snapshots/unsigned", nil); got != http.StatusOK {
		t.Fatalf("get: %d", got)
	}
	var info api.SnapshotInfo
	c.decode(&info)
	if info.Trust.State != trust.StateRefused || !strings.Contains(info.Trust.Reason, "unsigned") {
		t.Fatalf("trust of an unsigned snapshot on a daemon trusting %s: %+v", other.ID(), info.Trust)
	}
	if got := c.do("POST", "/restores", api.RestoreRequest{Snapshot: "unsigned", Device: "file"}); got != http.StatusForbidden {
		t.Fatalf("restore of an unsigned snapshot: %d (%s), want 403", got, c.lastBody)
	}
	var e api.Error
	c.decode(&e)
	if e.Field != "snapshot" || !strings.Contains(e.Error, imp.ID) || !strings.Contains(e.Error, "unsigned") {
		t.Fatalf("403 body %+v; want field snapshot naming %s and why", e, imp.ID)
	}
	_, err = r.client.Restore(context.Background(), api.RestoreRequest{Snapshot: "unsigned", Device: "file"})
	if !errors.Is(err, trust.ErrUntrusted) {
		t.Fatalf("client error %v does not match trust.ErrUntrusted", err)
	}
}

// wantTrust checks what n's GET /snapshots/{ref} says of its signatures.
func wantTrust(t *testing.T, n *s3Node, ref, state, key string) {
	t.Helper()
	info, err := n.client.Snapshot(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if info.Trust.State != state || info.Trust.Key != key {
		t.Fatalf("snapshot %s on %s: trust %+v; want %s by %q", ref, n.name, info.Trust, state, key)
	}
}

// rewriteVMState does what the bucket's write credentials allow: it
// replaces snapshot id's VM state object and puts its size and SHA-256
// into the record.
func rewriteVMState(t *testing.T, endpoint, id string, forged []byte) {
	t.Helper()
	ctx := context.Background()
	mc, err := miniotest.Client(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, data []byte) {
		if _, err := mc.PutObject(ctx, clusterBucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put("artifacts/"+id+"/vm_state.bin", forged)
	obj, err := mc.GetObject(ctx, clusterBucket, "catalog/records/"+id+".json", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(forged)
	rec["vm_state_size"], rec["vm_state_sha256"] = len(forged), hex.EncodeToString(sum[:])
	if data, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	put("catalog/records/"+id+".json", data)
}
