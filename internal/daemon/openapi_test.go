package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"warmstart/internal/api"
	"warmstart/internal/api/apitest"
	"warmstart/internal/daemon"
)

// apiCheck sends requests to the daemon's handler, validating each request
// and its response against the OpenAPI document, and notes which document
// operation and which mux pattern each one reached.
type apiCheck struct {
	t        *testing.T
	handler  http.Handler
	router   routers.Router
	docOps   map[string]bool // "METHOD /path" of the document, exercised or not
	muxHits  map[string]bool // mux patterns reached
	lastBody []byte
	// badRequest makes the next request one the document must refuse.
	badRequest bool
}

func newAPICheck(t *testing.T, h http.Handler) *apiCheck {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(daemon.OpenAPI())
	if err != nil {
		t.Fatalf("load openapi.json: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI 3 document: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	c := &apiCheck{t: t, handler: h, router: router, docOps: map[string]bool{}, muxHits: map[string]bool{}}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			c.docOps[method+" "+path] = false
		}
	}
	return c
}

// do sends one request and checks it and its answer against the document;
// it returns the status.
func (c *apiCheck) do(method, path string, body any) int {
	c.t.Helper()
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			c.t.Fatal(err)
		}
	}
	req := httptest.NewRequest(method, path, bytes.NewReader(raw))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		c.t.Fatalf("%s %s: not in the document: %v", method, path, err)
	}
	c.docOps[method+" "+route.Path] = true
	ctx := context.Background()
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	err = openapi3filter.ValidateRequest(ctx, in)
	switch {
	case c.badRequest && err == nil:
		c.t.Errorf("%s %s: the document admits a request the daemon refuses", method, path)
	case !c.badRequest && err != nil:
		c.t.Errorf("%s %s: request does not match the document: %v", method, path, err)
	}
	c.badRequest = false
	req.Body = io.NopCloser(bytes.NewReader(raw))
	rec := httptest.NewRecorder()
	c.handler.ServeHTTP(rec, req)
	if req.Pattern == "" {
		c.t.Errorf("%s %s: no mux route matched (status %d: %s)", method, path, rec.Code, rec.Body)
	}
	c.muxHits[req.Pattern] = true
	c.lastBody = rec.Body.Bytes()
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.Code, Header: rec.Header(),
		Body: io.NopCloser(bytes.NewReader(rec.Body.Bytes()))}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		c.t.Errorf("%s %s: %d response does not match the document: %v", method, path, rec.Code, err)
	}
	c.checkConvention(method, path, route.Operation, rec)
	return rec.Code
}

// checkConvention checks a JSON answer against the JSON convention
// (docs/json.md), and that its schema names every key it has.
func (c *apiCheck) checkConvention(method, path string, op *openapi3.Operation, rec *httptest.ResponseRecorder) {
	c.t.Helper()
	if path == "/openapi.json" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		return
	}
	what := method + " " + path
	apitest.CheckConvention(c.t, what, rec.Body.Bytes())
	resp := op.Responses.Status(rec.Code)
	if resp == nil {
		resp = op.Responses.Default()
	}
	if resp == nil || resp.Value == nil {
		return
	}
	if mt := resp.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil && mt.Schema.Value != nil {
		for _, k := range apitest.Undescribed(mt.Schema.Value, rec.Body.Bytes()) {
			c.t.Errorf("%s: %d answer has %s, which the document does not describe", what, rec.Code, k)
		}
	}
}

// decode reads the last response body into v.
func (c *apiCheck) decode(v any) {
	c.t.Helper()
	if err := json.Unmarshal(c.lastBody, v); err != nil {
		c.t.Fatalf("decode %q: %v", c.lastBody, err)
	}
}

// muxPatterns are the patterns daemon.go registers on its mux, read from
// the source so that a route added without a test and a document entry
// fails here.
func muxPatterns(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "daemon.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "mux" {
			return true
		}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok {
			p, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			patterns = append(patterns, p)
		}
		return true
	})
	if len(patterns) == 0 {
		t.Fatal("found no mux routes in daemon.go")
	}
	return patterns
}

// TestOpenAPIDescribesTheAPI exercises every route of the daemon, checks
// every request and response against openapi.json, and checks that every
// route of the mux is in the document and every operation of the
// document is a route.
func TestOpenAPIDescribesTheAPI(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	c := newAPICheck(t, r.d.Handler())

	want := func(what string, got, status int) {
		t.Helper()
		if got != status {
			t.Fatalf("%s: status %d, want %d: %s", what, got, status, c.lastBody)
		}
	}
	want("health", c.do("GET", "/healthz", nil), 200)
	want("metrics", c.do("GET", "/metrics", nil), 200)
	want("openapi", c.do("GET", "/openapi.json", nil), 200)
	want("import", c.do("POST", "/snapshots/import", f.importRequest("doc")), 201)
	var imp api.ImportResponse
	c.decode(&imp)
	want("list", c.do("GET", "/snapshots?has_manifest=false&alias_prefix=d", nil), 200)
	want("get", c.do("GET", "/snapshots/doc", nil), 200)
	want("record", c.do("POST", "/snapshots/doc/manifest:record", nil), 200)
	want("verify", c.do("POST", "/snapshots/doc/verify", api.VerifyRequest{}), 200)
	want("restore", c.do("POST", "/restores", api.RestoreRequest{Snapshot: "doc", Device: "file", Prefetch: "on"}), 201)
	var in api.RestoreInfo
	c.decode(&in)
	want("restores", c.do("GET", "/restores", nil), 200)
	want("restore by id", c.do("GET", "/restores/"+in.ID, nil), 200)
	want("pause of a restore not started pausable", c.do("POST", "/restores/"+in.ID+"/snapshot", api.PauseRequest{Then: api.ThenStop}), 409)
	want("stop", c.do("DELETE", "/restores/"+in.ID, nil), 200)
	// Errors are described too.
	want("unknown restore", c.do("GET", "/restores/"+in.ID, nil), 404)
	c.badRequest = true
	want("unknown device", c.do("POST", "/restores", map[string]string{"snapshot": "doc", "device": "nvme"}), 400)
	want("unknown snapshot", c.do("GET", "/snapshots/nobody", nil), 404)
	want("delete", c.do("DELETE", "/snapshots/"+imp.ID, nil), 200)

	var unexercised []string
	for op, hit := range c.docOps {
		if !hit {
			unexercised = append(unexercised, op)
		}
	}
	sort.Strings(unexercised)
	if len(unexercised) > 0 {
		t.Errorf("document operations no route served in this test: %s", strings.Join(unexercised, ", "))
	}
	for _, p := range muxPatterns(t) {
		if !c.muxHits[p] {
			t.Errorf("mux route %q is not exercised against the document", p)
		}
	}
}

// The document declares how TCP clients authenticate (a bearer token) and
// that it is optional, as it is on the Unix socket: a client generated
// from it sends the token.
func TestOpenAPIDeclaresTheBearerToken(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(daemon.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	scheme := doc.Components.SecuritySchemes["bearerAuth"]
	if scheme == nil || scheme.Value == nil || scheme.Value.Type != "http" || scheme.Value.Scheme != "bearer" {
		t.Fatalf("securitySchemes.bearerAuth = %+v, want an http bearer scheme", scheme)
	}
	var anonymous, bearer bool
	for _, req := range doc.Security {
		_, withToken := req["bearerAuth"]
		anonymous = anonymous || len(req) == 0
		bearer = bearer || withToken
	}
	if !anonymous || !bearer {
		t.Errorf("top-level security %v: want the bearer token, or none (the Unix socket)", doc.Security)
	}
}
