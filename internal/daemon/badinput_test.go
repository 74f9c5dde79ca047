package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/layout"
	"warmstart/internal/repository"
)

// Every kind of bad input gets the right status and a JSON error naming
// the field, and the daemon keeps serving.
func TestBadInput(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	imp := r.importAs(t, f, "taken")
	hc := rawClient(t, f.cfg.Daemon.Socket)
	var cases []badRequest
	cases = append(cases, lookupBadRequests(imp.ID)...)
	cases = append(cases, importBadRequests(t, f)...)
	cases = append(cases, actionBadRequests()...)
	cases = append(cases, restoreBadRequests()...)
	cases = append(cases, routeBadRequests()...)
	cases = append(cases, pauseBadRequests()...)
	cases = append(cases, keyBadRequests(t, f)...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkBadRequest(t, hc, tc) })
	}
	if h, err := r.client.Health(ctx); err != nil || h.Status != "ok" {
		t.Fatalf("after bad input: healthz = %+v, %v", h, err)
	}
	if _, err := os.Stat(f.ref.Memory); err != nil {
		t.Fatalf("a refused import touched its input: %v", err)
	}
	if recs, err := r.client.Snapshots(ctx, repository.Filter{}); err != nil || len(recs) != 1 {
		t.Fatalf("after bad imports: %d snapshots (%v), want only the first", len(recs), err)
	}
}

// unknownID is a UUIDv7 no snapshot has.
const unknownID = "01890a5d-ac96-774b-bcce-b302099a8057"

// badRequest is one bad request, the status it must get and the field its
// JSON error must name.
type badRequest struct {
	name, method, path, body string
	status                   int
	field                    string
}

// lookupBadRequests get, delete or list snapshots by bad or unknown names;
// takenID is the one snapshot's id.
func lookupBadRequests(takenID string) []badRequest {
	return []badRequest{
		{"alias with bad characters", "GET", "/snapshots/no%20spaces", "", 400, "id"},
		{"alias too long", "GET", "/snapshots/" + strings.Repeat("a", 129), "", 400, "id"},
		{"id that is not a UUIDv7", "GET", "/snapshots/6ba7b810-9dad-11d1-80b4-00c04fd430c8", "", 400, "id"},
		{"id not in canonical form", "GET", "/snapshots/" + strings.ToUpper(takenID), "", 400, "id"},
		{"unknown id", "GET", "/snapshots/" + unknownID, "", 404, "id"},
		{"unknown alias", "GET", "/snapshots/nobody", "", 404, "id"},
		// An older build may have bound an alias starting with '-'.
		{"unknown alias starting with a dash", "GET", "/snapshots/-x", "", 404, "id"},
		{"delete unknown alias", "DELETE", "/snapshots/nobody", "", 404, "id"},
		{"delete unknown id", "DELETE", "/snapshots/" + unknownID, "", 404, "id"},
		{"delete bad alias", "DELETE", "/snapshots/a.b", "", 400, "id"},
		{"list with unknown parameter", "GET", "/snapshots?colour=blue", "", 400, "colour"},
		{"list with bad has_manifest", "GET", "/snapshots?has_manifest=maybe", "", 400, "has_manifest"},
		{"list with bad alias prefix", "GET", "/snapshots?alias_prefix=a/b", "", 400, "alias_prefix"},
	}
}

// importBadRequests are imports with bad bodies, fields or files.
func importBadRequests(t *testing.T, f *fixture) []badRequest {
	t.Helper()
	notRegular := filepath.Join(f.dir, "ref")
	empty := filepath.Join(f.dir, "empty.bin")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	regions := make([]string, layout.MaxRegions+1)
	for i := range regions {
		regions[i] = fmt.Sprintf("%d:4096", i*4096)
	}
	importBody := func(mutate func(map[string]any)) string {
		m := map[string]any{"vm_state": f.ref.VMState, "memory": f.ref.Memory, "layout": f.layout}
		mutate(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	return []badRequest{
		{"import malformed JSON", "POST", "/snapshots/import", `{"vm_state": `, 400, "body"},
		{"import syntax error", "POST", "/snapshots/import", `{"vm_state" "x"}`, 400, "body"},
		{"import empty body", "POST", "/snapshots/import", ``, 400, "body"},
		{"import array body", "POST", "/snapshots/import", `[1, 2]`, 400, "body"},
		{"import two objects", "POST", "/snapshots/import", `{} {}`, 400, "body"},
		{"import unknown field", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["colour"] = "blue" }), 400, "colour"},
		{"import wrong type", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["alias"] = 5 }), 400, "alias"},
		{"import without vm_state", "POST", "/snapshots/import", importBody(func(m map[string]any) { delete(m, "vm_state") }), 400, "vm_state"},
		{"import without memory", "POST", "/snapshots/import", importBody(func(m map[string]any) { delete(m, "memory") }), 400, "memory"},
		{"import relative path", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["memory"] = "memory.bin" }), 400, "memory"},
		{"import missing file", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["vm_state"] = filepath.Join(f.dir, "nonexistent") }), 400, "vm_state"},
		// Outside import_dirs: refused before the file is looked at.
		{"import missing file outside", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["vm_state"] = "/nonexistent/vm" }), 403, "vm_state"},
		{"import directory", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["memory"] = notRegular }), 400, "memory"},
		{"import bad alias", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["alias"] = "a/b" }), 400, "alias"},
		{"import alias read as a flag", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["alias"] = "-x" }), 400, "alias"},
		{"import alias like an id", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["alias"] = unknownID }), 400, "alias"},
		{"import empty vm_state", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["vm_state"] = empty }), 400, "vm_state"},
		{"import vm_state on procfs", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["vm_state"] = "/proc/self/environ" }), 403, "vm_state"},
		{"import memory on procfs", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["memory"] = "/proc/self/environ" }), 403, "memory"},
		{"import too many regions", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["layout"] = strings.Join(regions, ",") }), 400, "layout"},
		{"import bad layout", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["layout"] = "0:1GiB" }), 400, "layout"},
		{"import taken alias", "POST", "/snapshots/import", importBody(func(m map[string]any) { m["alias"] = "taken" }), 409, "alias"},
		{"import oversized body", "POST", "/snapshots/import", `{"vm_state": "` + strings.Repeat("x", 2<<20) + `"}`, 413, "body"},
	}
}

// actionBadRequests are record and verify requests on bad or unknown
// snapshots, or with bad bodies.
func actionBadRequests() []badRequest {
	return []badRequest{
		{"record unknown snapshot", "POST", "/snapshots/" + unknownID + "/manifest:record", "", 404, "id"},
		{"record bad alias", "POST", "/snapshots/a.b/manifest:record", "", 400, "id"},
		{"record with an option", "POST", "/snapshots/taken/manifest:record", `{"trace": "x"}`, 400, "trace"},
		{"record malformed JSON", "POST", "/snapshots/taken/manifest:record", `{"trace"`, 400, "body"},
		{"unknown snapshot action", "POST", "/snapshots/taken/manifest:erase", "", 404, "path"},
		{"verify unknown snapshot", "POST", "/snapshots/" + unknownID + "/verify", "", 404, "id"},
		{"verify unknown alias", "POST", "/snapshots/nobody/verify", `{"add_digests": true}`, 404, "id"},
		{"verify bad alias", "POST", "/snapshots/a.b/verify", "", 400, "id"},
		{"verify unknown field", "POST", "/snapshots/taken/verify", `{"add": true}`, 400, "add"},
		{"verify malformed JSON", "POST", "/snapshots/taken/verify", `{"add_digests": `, 400, "body"},
		{"verify add_digests as string", "POST", "/snapshots/taken/verify", `{"add_digests": "yes"}`, 400, "add_digests"},
		{"verify with GET", "GET", "/snapshots/taken/verify", "", 405, "method"},
	}
}

// restoreBadRequests are restore requests with bad bodies or values, and
// requests for unknown restores.
func restoreBadRequests() []badRequest {
	return []badRequest{
		{"restore malformed JSON", "POST", "/restores", `{"snapshot": "taken"`, 400, "body"},
		{"restore unknown field", "POST", "/restores", `{"snapshot": "taken", "vcpus": 2}`, 400, "vcpus"},
		{"restore without snapshot", "POST", "/restores", `{}`, 400, "snapshot"},
		{"restore bad alias", "POST", "/restores", `{"snapshot": "a b"}`, 400, "snapshot"},
		{"restore unknown snapshot", "POST", "/restores", `{"snapshot": "nobody"}`, 404, "snapshot"},
		{"restore unknown device", "POST", "/restores", `{"snapshot": "taken", "device": "nbd"}`, 400, "device"},
		{"restore unknown prefetch mode", "POST", "/restores", `{"snapshot": "taken", "prefetch": "maybe"}`, 400, "prefetch"},
		{"restore unknown policy", "POST", "/restores", `{"snapshot": "taken", "policy": "greedy"}`, 400, "policy"},
		{"restore bad io_engine", "POST", "/restores", `{"snapshot": "taken", "io_engine": 7}`, 400, "io_engine"},
		{"restore io_engine as string", "POST", "/restores", `{"snapshot": "taken", "io_engine": "2"}`, 400, "io_engine"},
		{"stop unknown restore", "DELETE", "/restores/nope", "", 404, "id"},
		{"get unknown restore", "GET", "/restores/nope", "", 404, "id"},
	}
}

// pauseBadRequests are pauses with bad fields, each refused naming it
// before the restore is looked up, and of unknown restores.
func pauseBadRequests() []badRequest {
	return []badRequest{
		{"pause bad alias", "POST", "/restores/nope/snapshot", `{"alias": "a/b"}`, 400, "alias"},
		{"pause alias like an id", "POST", "/restores/nope/snapshot", `{"alias": "` + unknownID + `"}`, 400, "alias"},
		{"pause unknown then", "POST", "/restores/nope/snapshot", `{"then": "later"}`, 400, "then"},
		{"pause then as number", "POST", "/restores/nope/snapshot", `{"then": 1}`, 400, "then"},
		{"pause unknown field", "POST", "/restores/nope/snapshot", `{"name": "x"}`, 400, "name"},
		{"pause malformed JSON", "POST", "/restores/nope/snapshot", `{"alias": `, 400, "body"},
		{"pause unknown restore", "POST", "/restores/nope/snapshot", `{"alias": "child"}`, 404, "id"},
	}
}

// keyBadRequests spell a known key in another case, give one twice, or
// send null for the object: each endpoint that takes a body refuses them
// naming the key (or the body), so a misspelt key never silently works or
// is ignored.
func keyBadRequests(t *testing.T, f *fixture) []badRequest {
	t.Helper()
	imp, err := json.Marshal(map[string]any{"VM_STATE": f.ref.VMState, "memory": f.ref.Memory, "layout": f.layout})
	if err != nil {
		t.Fatal(err)
	}
	return []badRequest{
		{"import key in upper case", "POST", "/snapshots/import", string(imp), 400, "VM_STATE"},
		{"restore key in upper case", "POST", "/restores", `{"SNAPSHOT": "taken"}`, 400, "SNAPSHOT"},
		{"restore key capitalised", "POST", "/restores", `{"snapshot": "taken", "Device": "file"}`, 400, "Device"},
		{"restore key twice", "POST", "/restores", `{"snapshot": "taken", "snapshot": "nobody"}`, 400, "snapshot"},
		{"restore null body", "POST", "/restores", `null`, 400, "body"},
		{"verify key in mixed case", "POST", "/snapshots/taken/verify", `{"Add_Digests": true}`, 400, "Add_Digests"},
		{"pause key in upper case", "POST", "/restores/nope/snapshot", `{"THEN": "stop"}`, 400, "THEN"},
		{"pause key twice", "POST", "/restores/nope/snapshot", `{"then": "stop", "then": "resume"}`, 400, "then"},
	}
}

// routeBadRequests are requests for no route or with the wrong method.
func routeBadRequests() []badRequest {
	return []badRequest{
		{"unknown path", "GET", "/nope", "", 404, "path"},
		{"wrong method", "DELETE", "/healthz", "", 405, "method"},
		{"wrong method on restores", "PUT", "/restores", "", 405, "method"},
	}
}

// checkBadRequest sends tc and checks its status, that the body is a JSON
// error naming tc's field, and the content type.
func checkBadRequest(t *testing.T, hc *http.Client, tc badRequest) {
	t.Helper()
	var body io.Reader
	if tc.body != "" {
		body = strings.NewReader(tc.body)
	}
	req, err := http.NewRequest(tc.method, "http://warmstart"+tc.path, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e api.Error
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("status %d with a body that is not a JSON error: %v", resp.StatusCode, err)
	}
	if resp.StatusCode != tc.status || e.Field != tc.field || e.Error == "" {
		t.Errorf("%s %s = %d %+v, want %d naming field %q", tc.method, tc.path, resp.StatusCode, e, tc.status, tc.field)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

// The colon of manifest:record may arrive percent-encoded.
func TestRecordRouteWithEscapedColon(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	imp := r.importAs(t, f, "")
	hc := rawClient(t, f.cfg.Daemon.Socket)
	resp, err := hc.Post(fmt.Sprintf("http://warmstart/snapshots/%s/manifest%%3Arecord", imp.ID), "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res struct {
		SnapshotID string `json:"snapshot_id"`
		Descriptor struct {
			SHA256 string `json:"sha256"`
		} `json:"descriptor"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST manifest%%3Arecord = %d, %v", resp.StatusCode, err)
	}
	if res.SnapshotID != imp.ID || res.Descriptor.SHA256 == "" {
		t.Fatalf("record result %+v", res)
	}
}

// maxEcho is the daemon's bound on an error message (maxEchoBytes).
const maxEcho = 1024

// An error body quotes at most maxEchoBytes of what the client sent,
// however long the path (outside import_dirs: 403), layout or field name.
func TestErrorBodiesBoundTheirEcho(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	startDaemon(t, f, nil)
	hc := rawClient(t, f.cfg.Daemon.Socket)
	long := strings.Repeat("x", 100<<10)
	for name, body := range map[string]string{
		"path":   `{"vm_state": "/` + long + `", "memory": "/m"}`,
		"layout": fmt.Sprintf(`{"vm_state": %q, "memory": %q, "layout": "0:%s"}`, f.ref.VMState, f.ref.Memory, long),
		"field":  `{"` + long + `": 1}`,
	} {
		resp, err := hc.Post("http://warmstart/snapshots/import", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := http.StatusBadRequest
		if name == "path" {
			want = http.StatusForbidden
		}
		if resp.StatusCode != want || strings.Contains(string(raw), strings.Repeat("x", maxEcho+1)) || len(raw) > 2*maxEcho {
			t.Errorf("%s: %d with a %d-byte body: %.300s", name, resp.StatusCode, len(raw), raw)
		}
	}
}
