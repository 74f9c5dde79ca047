package report

import (
	"strings"
	"testing"
)

// TestDeleteLines: both delete paths (in process and on a daemon) print
// these, so their wording is fixed here once.
func TestDeleteLines(t *testing.T) {
	const id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	for _, tc := range []struct {
		name string
		run  func(*strings.Builder) error
		want string
	}{
		{"absent id", func(b *strings.Builder) error { return NothingToDelete(b, id) }, "snapshot " + id + " does not exist; nothing to delete\n"},
		{"absent alias", func(b *strings.Builder) error { return NothingToDelete(b, "web") }, "no snapshot has alias web; nothing to delete\n"},
		{"deleted", func(b *strings.Builder) error { return Deleted(b, id, "") }, "deleted snapshot " + id + "\n"},
		{"deleted alias", func(b *strings.Builder) error { return Deleted(b, id, "web") }, "deleted snapshot " + id + " (alias web)\n"},
	} {
		var b strings.Builder
		if err := tc.run(&b); err != nil || b.String() != tc.want {
			t.Errorf("%s: printed %q (error %v), want %q", tc.name, b.String(), err, tc.want)
		}
	}
	if got := Size(3000); got != "2.9 KiB" {
		t.Errorf("Size(3000) = %q", got)
	}
}
