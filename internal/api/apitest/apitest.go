// Package apitest checks JSON documents against the JSON convention
// (docs/json.md) and against the schemas of the OpenAPI document, for the
// tests of every package that writes JSON: the daemon's answers, the
// verbs' --json and the benchmarks' reports.
package apitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// unitSuffixes are the units the convention leaves out of JSON: a
// duration is integer nanoseconds (_ns), a size bytes (_bytes).
var unitSuffixes = []string{"_ms", "_us", "_seconds", "_secs", "_mib", "_kib", "_mb", "_kb"}

// keyPattern is a snake_case key. Map keys that name things (policy names
// such as "warmstart+learned") may carry a "+".
var keyPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_+]*$`)

// Convention returns every way doc breaks the JSON convention, by JSON
// path; none for a document that keeps it: no number or boolean written as
// a string, snake_case keys, durations as integers in keys ending in _ns,
// no other time or size unit in a key, and a restore that carries a stop
// report says "stopped".
func Convention(doc []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{fmt.Sprintf("not JSON: %v", err)}
	}
	var bad []string
	walk("$", "", v, &bad)
	sort.Strings(bad)
	return bad
}

// CheckConvention fails t for every way doc breaks the convention.
func CheckConvention(t testing.TB, what string, doc []byte) {
	t.Helper()
	for _, b := range Convention(doc) {
		t.Errorf("%s: %s (docs/json.md)", what, b)
	}
}

func walk(path, key string, v any, bad *[]string) {
	switch x := v.(type) {
	case map[string]any:
		checkObject(path, x, bad)
		for _, k := range slices.Sorted(mapKeys(x)) {
			walk(path+"."+k, k, x[k], bad)
		}
	case []any:
		for i, e := range x {
			walk(fmt.Sprintf("%s[%d]", path, i), key, e, bad)
		}
	case json.Number:
		if strings.HasSuffix(key, "_ns") && strings.ContainsAny(string(x), ".eE") {
			*bad = append(*bad, fmt.Sprintf("%s = %s: a duration is an integer of nanoseconds", path, x))
		}
	case string:
		checkString(path, key, x, bad)
	case bool, nil:
		if strings.HasSuffix(key, "_ns") {
			*bad = append(*bad, fmt.Sprintf("%s = %v: a duration is an integer of nanoseconds", path, x))
		}
	}
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// checkObject checks an object's keys and its state.
func checkObject(path string, obj map[string]any, bad *[]string) {
	for k := range obj {
		if !keyPattern.MatchString(k) {
			*bad = append(*bad, fmt.Sprintf("%s.%s: key is not snake_case", path, k))
		}
		for _, u := range unitSuffixes {
			if strings.HasSuffix(k, u) {
				*bad = append(*bad, fmt.Sprintf("%s.%s: unit %s; durations are _ns, sizes _bytes", path, k, u))
			}
		}
	}
	if _, stopped := obj["stop"]; stopped && obj["state"] != nil && obj["state"] != "stopped" {
		*bad = append(*bad, fmt.Sprintf("%s.state = %v after the restore was stopped; want stopped", path, obj["state"]))
	}
}

// checkString refuses a number or a boolean written as a string.
func checkString(path, key, s string, bad *[]string) {
	if strings.HasSuffix(key, "_ns") {
		*bad = append(*bad, fmt.Sprintf("%s = %q: a duration is an integer of nanoseconds", path, s))
		return
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil && s != "" {
		*bad = append(*bad, fmt.Sprintf("%s = %q: a number written as a string", path, s))
	}
	if s == "true" || s == "false" {
		*bad = append(*bad, fmt.Sprintf("%s = %q: a boolean written as a string", path, s))
	}
}

// Schemas are the component schemas of an OpenAPI document.
type Schemas struct {
	doc *openapi3.T
}

// LoadSchemas loads and validates the OpenAPI document doc.
func LoadSchemas(t testing.TB, doc []byte) Schemas {
	t.Helper()
	loader := openapi3.NewLoader()
	d, err := loader.LoadFromData(doc)
	if err != nil {
		t.Fatalf("load openapi.json: %v", err)
	}
	if err := d.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI 3 document: %v", err)
	}
	return Schemas{d}
}

// Check validates doc against the named component schema, which must
// also describe every key doc has (a field the document does not
// describe is a field no client knows of), and against the convention.
// An array document is checked element by element when array is set.
func (s Schemas) Check(t testing.TB, what, name string, doc []byte, array bool) {
	t.Helper()
	ref, ok := s.doc.Components.Schemas[name]
	if !ok || ref.Value == nil {
		t.Fatalf("%s: openapi.json has no schema %s", what, name)
	}
	CheckConvention(t, what, doc)
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", what, err, doc)
	}
	items := []any{v}
	if array {
		arr, ok := v.([]any)
		if !ok {
			t.Fatalf("%s: want an array of %s, got %s", what, name, doc)
		}
		items = arr
	}
	for i, item := range items {
		if err := ref.Value.VisitJSON(item); err != nil {
			t.Errorf("%s [%d]: does not match schema %s: %v", what, i, name, err)
		}
		for _, b := range undescribed("$", ref.Value, item) {
			t.Errorf("%s [%d]: %s is not in schema %s", what, i, b, name)
		}
	}
}

// Undescribed lists the keys of the JSON document doc, by path, that
// schema does not name: fields no client of the document knows of.
func Undescribed(schema *openapi3.Schema, doc []byte) []string {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return []string{fmt.Sprintf("not JSON: %v", err)}
	}
	return undescribed("$", schema, v)
}

// undescribed lists the keys of v, by path, that schema does not name.
// Objects whose schema names no properties (free-form maps) are not
// looked into.
func undescribed(path string, schema *openapi3.Schema, v any) []string {
	switch x := v.(type) {
	case map[string]any:
		props := properties(schema)
		if len(props) == 0 {
			return nil
		}
		var out []string
		for _, k := range slices.Sorted(mapKeys(x)) {
			p, ok := props[k]
			if !ok {
				out = append(out, path+"."+k)
				continue
			}
			out = append(out, undescribed(path+"."+k, p, x[k])...)
		}
		return out
	case []any:
		if schema.Items == nil || schema.Items.Value == nil {
			return nil
		}
		var out []string
		for i, e := range x {
			out = append(out, undescribed(fmt.Sprintf("%s[%d]", path, i), schema.Items.Value, e)...)
		}
		return out
	}
	return nil
}

// properties are the properties schema names, its allOf parts' included.
func properties(schema *openapi3.Schema) map[string]*openapi3.Schema {
	props := map[string]*openapi3.Schema{}
	for k, p := range schema.Properties {
		if p != nil && p.Value != nil {
			props[k] = p.Value
		}
	}
	for _, part := range schema.AllOf {
		if part == nil || part.Value == nil {
			continue
		}
		for k, p := range properties(part.Value) {
			props[k] = p
		}
	}
	return props
}
