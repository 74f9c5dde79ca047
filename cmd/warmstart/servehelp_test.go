package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/api"
)

// TestServeHelpNamesEveryRequestField: serve --help shows each route that
// takes a body with the body's keys in braces; they are exactly the JSON
// names of its request type, which the daemon takes and no other.
func TestServeHelpNamesEveryRequestField(t *testing.T) {
	r := runCLI(t, "serve", "--help")
	if r.code != 0 {
		t.Fatalf("serve --help: exit %d: %s", r.code, r.stderr)
	}
	for route, req := range map[string]any{
		"/snapshots/import":        api.ImportRequest{},
		"POST   /restores ":        api.RestoreRequest{},
		"/restores/{id}/snapshot ": api.PauseRequest{},
	} {
		var want []string
		for f := range reflect.TypeOf(req).Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			want = append(want, name)
		}
		var got []string
		for line := range strings.SplitSeq(r.stdout, "\n") {
			if _, rest, ok := strings.Cut(line, route); ok {
				_, keys, _ := strings.Cut(rest, "{")
				keys, _, _ = strings.Cut(keys, "}")
				got = strings.Split(keys, ", ")
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("serve --help shows %s with %v, want %v", route, got, want)
		}
	}
}
