package posixfs

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestLinkAcrossFileSystemsIsTheRequestsToChange: a linked import whose
// sources are on another file system than the store cannot be a hard link.
// The error says so and what to do (import without link), on the link
// field of an invalid request, not only "invalid cross-device link".
func TestLinkAcrossFileSystemsIsTheRequestsToChange(t *testing.T) {
	r := openTemp(t, Options{})
	other := t.TempDir()
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=16m"); err != nil {
		t.Skipf("mount a tmpfs for the sources: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(other, 0); err != nil {
			t.Errorf("unmount %s: %v", other, err)
		}
	})
	in := repotest.NewInputsIn(t, other, repotest.SmallMemoryBytes)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	req := in.Request("far")
	req.Link = true
	_, err = r.Publish(bg(), lease, req)
	if !errors.Is(err, unix.EXDEV) || !errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("linked Publish across file systems = %v, want an invalid request wrapping EXDEV", err)
	}
	if fe := (*repository.FieldError)(nil); !errors.As(err, &fe) || fe.Field != repository.FieldLink {
		t.Fatalf("linked Publish across file systems = %v, want it on field %q", err, repository.FieldLink)
	}
	for _, want := range []string{"cannot cross file systems", "without --link"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("linked Publish across file systems = %q, want it to say %q", err, want)
		}
	}
}
