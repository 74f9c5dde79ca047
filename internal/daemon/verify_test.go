package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/integrity"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/snapcheck"
)

// POST /snapshots/{id}/verify answers the report with 200 whether or not
// it found problems; add_digests gives a legacy snapshot its table.
func TestVerifyEndpoint(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	c := r.client
	ctx := context.Background()
	imp, err := c.Import(ctx, f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}

	rep, err := c.VerifySnapshot(ctx, "ref", api.VerifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.ID != imp.ID || rep.Unverified || memoryOf(t, rep).Blocks == nil {
		t.Fatalf("verify of a clean snapshot: %+v", rep)
	}
	checkLegacyGetsDigests(t, c, f, imp)
	checkFlippedByteReported(t, c, f, imp.ID)
	if _, err := c.VerifySnapshot(ctx, "nobody", api.VerifyRequest{}); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("verify of an unknown alias: %v, want 404", err)
	}
}

// checkLegacyGetsDigests: a legacy snapshot verifies unverified, then
// add_digests gives it the table published with it.
func checkLegacyGetsDigests(t *testing.T, c *api.Client, f *fixture, imp api.ImportResponse) {
	t.Helper()
	ctx := context.Background()
	posixfstest.StripDigests(t, f.cfg.Backend.PosixFS.SnapshotStore, imp.ID)
	if rep, err := c.VerifySnapshot(ctx, imp.ID, api.VerifyRequest{}); err != nil || !rep.OK || !rep.Unverified {
		t.Fatalf("verify of a legacy snapshot: %+v, %v", rep, err)
	}
	rep, err := c.VerifySnapshot(ctx, imp.ID, api.VerifyRequest{AddDigests: true})
	if err != nil || !rep.OK || rep.DigestsAdded == nil || *rep.DigestsAdded != *imp.MemoryDigests ||
		rep.SHA256DigestsAdded == nil || *rep.SHA256DigestsAdded != *imp.MemorySHA256Digests {
		t.Fatalf("verify add_digests: %+v, %v; want the published tables %+v and %+v", rep, err, *imp.MemoryDigests, *imp.MemorySHA256Digests)
	}
	m := metricsOf(t, c)
	if got := value(m, "warmstart_repository_operation_seconds", map[string]string{"operation": "attach_digests", "outcome": "ok"}); got != 2 {
		t.Errorf("attach_digests observed %v times, want 2 (both tables)", got)
	}
}

// checkFlippedByteReported: after a flipped byte the verify still answers
// 200, and the report names the block.
func checkFlippedByteReported(t *testing.T, c *api.Client, f *fixture, id string) {
	t.Helper()
	info, err := c.Snapshot(context.Background(), id)
	if err != nil || info.Files == nil {
		t.Fatalf("snapshot files: %+v, %v", info, err)
	}
	const off = 5*integrity.BlockBytes + 9
	repotest.FlipBytes(t, info.Files.Memory, off)
	rep := postVerify(t, f, id, "")
	mem := memoryOf(t, rep)
	if rep.OK || mem.Blocks == nil || mem.Blocks.Bad != 1 || mem.Blocks.BadRanges[0].Offset != 5*integrity.BlockBytes {
		t.Fatalf("verify after a flipped byte at %d: %+v", off, rep)
	}
}

// postVerify sends a hand-made request, so the snake_case wire form is
// what is checked.
func postVerify(t *testing.T, f *fixture, ref, body string) snapcheck.Report {
	t.Helper()
	hc := rawClient(t, f.cfg.Daemon.Socket)
	resp, err := hc.Post("http://warmstart/snapshots/"+ref+"/verify", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST verify = %d, %v", resp.StatusCode, err)
	}
	if _, ok := raw["ok"].(bool); !ok {
		t.Fatalf("report has no boolean ok: %v", raw)
	}
	data, _ := json.Marshal(raw)
	var rep snapcheck.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func memoryOf(t *testing.T, rep snapcheck.Report) snapcheck.Artifact {
	t.Helper()
	for _, a := range rep.Artifacts {
		if a.Name == repository.MemoryFileName {
			return a
		}
	}
	t.Fatalf("report has no %s: %+v", repository.MemoryFileName, rep)
	return snapcheck.Artifact{}
}
