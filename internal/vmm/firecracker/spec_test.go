package firecracker

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"
)

// specPath is the OpenAPI description of a Firecracker release, vendored
// with the tests (see testdata/README.md) so that a plain clone checks
// requests against it.
func specPath(version string) string {
	return filepath.Join("testdata", "firecracker-"+version+".yaml")
}

// schema is the part of a Swagger 2.0 schema object the checks use.
type schema struct {
	Ref        string             `yaml:"$ref"`
	Type       string             `yaml:"type"`
	Required   []string           `yaml:"required"`
	Properties map[string]*schema `yaml:"properties"`
	Items      *schema            `yaml:"items"`
	Enum       []string           `yaml:"enum"`
	Minimum    *float64           `yaml:"minimum"`
	Maximum    *float64           `yaml:"maximum"`
}

type specParameter struct {
	Name     string  `yaml:"name"`
	In       string  `yaml:"in"`
	Required bool    `yaml:"required"`
	Schema   *schema `yaml:"schema"`
}

type specOperation struct {
	Parameters []specParameter `yaml:"parameters"`
}

type apiSpec struct {
	Info struct {
		Version string `yaml:"version"`
	} `yaml:"info"`
	Paths       map[string]map[string]specOperation `yaml:"paths"`
	Definitions map[string]*schema                  `yaml:"definitions"`
}

var (
	specsMu sync.Mutex
	specs   = map[string]*apiSpec{}
)

// readSpec parses the description at path, once per path.
func readSpec(path string) (*apiSpec, error) {
	specsMu.Lock()
	defer specsMu.Unlock()
	if s, ok := specs[path]; ok {
		return s, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read Firecracker's API description: %w", err)
	}
	var s apiSpec
	if err := yaml.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if len(s.Paths) == 0 || len(s.Definitions) == 0 {
		return nil, fmt.Errorf("%s describes no paths or definitions", path)
	}
	specs[path] = &s
	return &s, nil
}

// loadSpec parses the vendored description of version. A missing or
// unreadable one fails the test rather than skipping it: without it no
// request is checked at all.
func loadSpec(t *testing.T, version string) *apiSpec {
	t.Helper()
	s, err := readSpec(specPath(version))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// operation finds the spec's operation for a request, matching templated
// segments such as {drive_id}. It returns the spec's path template.
func (s *apiSpec) operation(method, path string) (string, specOperation, error) {
	segs := strings.Split(path, "/")
	for tmpl, ops := range s.Paths {
		tsegs := strings.Split(tmpl, "/")
		if len(tsegs) != len(segs) {
			continue
		}
		match := true
		for i := range tsegs {
			isParam := strings.HasPrefix(tsegs[i], "{") && strings.HasSuffix(tsegs[i], "}")
			if !(tsegs[i] == segs[i] || isParam && segs[i] != "") {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		op, ok := ops[strings.ToLower(method)]
		if !ok {
			return tmpl, specOperation{}, fmt.Errorf("%s has no %s operation", tmpl, method)
		}
		return tmpl, op, nil
	}
	return "", specOperation{}, fmt.Errorf("no path in the spec matches %s", path)
}

// checkRequest validates a request's body against its operation's body
// parameter and returns the spec's path template.
func (s *apiSpec) checkRequest(method, path string, body []byte) (string, []error) {
	tmpl, op, err := s.operation(method, path)
	if err != nil {
		return "", []error{err}
	}
	var param *specParameter
	for i := range op.Parameters {
		if op.Parameters[i].In == "body" {
			param = &op.Parameters[i]
		}
	}
	switch {
	case param == nil && len(body) > 0:
		return tmpl, []error{fmt.Errorf("%s %s takes no body", method, tmpl)}
	case param == nil:
		return tmpl, nil
	case len(body) == 0 && param.Required:
		return tmpl, []error{fmt.Errorf("%s %s requires a body", method, tmpl)}
	case len(body) == 0:
		return tmpl, nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return tmpl, []error{fmt.Errorf("body is not JSON: %w", err)}
	}
	return tmpl, s.check(param.Schema, v, "body")
}

// check validates v against sc: types, required fields, enums, bounds and
// unknown properties where the schema lists its properties.
func (s *apiSpec) check(sc *schema, v any, where string) []error {
	if sc == nil {
		return nil
	}
	if sc.Ref != "" {
		def, ok := s.Definitions[strings.TrimPrefix(sc.Ref, "#/definitions/")]
		if !ok {
			return []error{fmt.Errorf("%s: unresolved $ref %s", where, sc.Ref)}
		}
		return s.check(def, v, where)
	}
	if v == nil {
		return []error{fmt.Errorf("%s: null", where)}
	}
	typ := sc.Type
	if typ == "" && sc.Properties != nil {
		typ = "object"
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{where}, args...)...))
	}
	switch typ {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			fail("want an object, got %T", v)
			break
		}
		for _, r := range sc.Required {
			if _, ok := obj[r]; !ok {
				fail("required property %q missing", r)
			}
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			prop, ok := sc.Properties[k]
			if !ok {
				if sc.Properties != nil {
					fail("unknown property %q", k)
				}
				continue
			}
			errs = append(errs, s.check(prop, obj[k], where+"."+k)...)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			fail("want a string, got %T", v)
		} else if len(sc.Enum) > 0 && !slices.Contains(sc.Enum, str) {
			fail("%q is not one of %v", str, sc.Enum)
		}
	case "integer":
		n, ok := v.(float64)
		if !ok || n != math.Trunc(n) {
			fail("want an integer, got %v", v)
			break
		}
		if sc.Minimum != nil && n < *sc.Minimum {
			fail("%v is below the minimum %v", n, *sc.Minimum)
		}
		if sc.Maximum != nil && n > *sc.Maximum {
			fail("%v is above the maximum %v", n, *sc.Maximum)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			fail("want a boolean, got %T", v)
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			fail("want an array, got %T", v)
			break
		}
		for i, item := range arr {
			errs = append(errs, s.check(sc.Items, item, fmt.Sprintf("%s[%d]", where, i))...)
		}
	}
	return errs
}

// TestSpecCheckerRejects shows the checker catches each kind of mistake,
// so that the tests relying on it can fail.
func TestSpecCheckerRejects(t *testing.T) {
	spec := loadSpec(t, newestFakeVersion)
	cases := []struct {
		name, method, path, body, want string
	}{
		{"missing required", "PUT", "/snapshot/load", `{"mem_backend":{"backend_type":"File","backend_path":"/m"}}`, `required property "snapshot_path"`},
		{"bad enum", "PATCH", "/vm", `{"state":"Stopped"}`, `"Stopped" is not one of`},
		{"nested bad enum", "PUT", "/snapshot/load", `{"snapshot_path":"/s","mem_backend":{"backend_type":"Disk","backend_path":"/m"}}`, "body.mem_backend.backend_type"},
		{"unknown property", "PUT", "/snapshot/create", `{"snapshot_path":"/s","mem_file_path":"/m","compress":true}`, `unknown property "compress"`},
		{"wrong type", "PUT", "/machine-config", `{"vcpu_count":"2","mem_size_mib":128}`, "want an integer"},
		{"below minimum", "PUT", "/vsock", `{"guest_cid":2,"uds_path":"/v"}`, "below the minimum"},
		{"unknown path", "PUT", "/snapshot/restore", `{}`, "no path in the spec"},
		{"unknown method", "DELETE", "/vm", ``, "no DELETE operation"},
		{"missing body", "PUT", "/actions", ``, "requires a body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errs := spec.checkRequest(c.method, c.path, []byte(c.body))
			if !strings.Contains(fmt.Sprint(errs), c.want) {
				t.Fatalf("errors %v, want one containing %q", errs, c.want)
			}
		})
	}
	if _, errs := spec.checkRequest("PUT", "/drives/root", []byte(`{"drive_id":"root","is_root_device":true,"path_on_host":"/r","is_read_only":false}`)); len(errs) > 0 {
		t.Fatalf("a valid drive was rejected: %v", errs)
	}
}

// checkRecords validates every recorded request against the description
// of the release that received it and returns the set of "METHOD template"
// operations seen, plus the values of the enum fields that tell the
// variants apart.
func checkRecords(t *testing.T, version string, records []recordedRequest) map[string]bool {
	t.Helper()
	spec := loadSpec(t, version)
	seen := map[string]bool{}
	for _, r := range records {
		tmpl, errs := spec.checkRequest(r.Method, r.Path, r.Body)
		if len(errs) > 0 {
			t.Errorf("%s %s %s: %v", r.Method, r.Path, r.Body, errors.Join(errs...))
			continue
		}
		op := r.Method + " " + tmpl
		seen[op] = true
		var body map[string]any
		_ = json.Unmarshal(r.Body, &body)
		for _, key := range []string{"action_type", "state", "snapshot_type"} {
			if v, ok := body[key].(string); ok {
				seen[op+" "+v] = true
			}
		}
		if mb, ok := body["mem_backend"].(map[string]any); ok {
			seen[fmt.Sprintf("%s %v", op, mb["backend_type"])] = true
		}
	}
	return seen
}

func requireSeen(t *testing.T, seen map[string]bool, want ...string) {
	t.Helper()
	for _, w := range want {
		if !seen[w] {
			keys := make([]string, 0, len(seen))
			for k := range seen {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			t.Errorf("no request %q was sent; seen %v", w, keys)
		}
	}
}
