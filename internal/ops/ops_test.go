package ops_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"warmstart/internal/node"
	"warmstart/internal/ops"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/trust"
)

func openStore(t *testing.T) repository.Repository {
	t.Helper()
	repo, err := posixfs.Open(t.TempDir(), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// TestPublishHoldsTheLeaseOnlyForARecording: a publish that asks for its
// manifest to be recorded keeps the snapshot leased for the recorder; one
// that does not leaves nothing held, so the snapshot can be deleted at
// once.
func TestPublishHoldsTheLeaseOnlyForARecording(t *testing.T) {
	ctx := context.Background()
	repo := openStore(t)
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)

	rec, lease, err := ops.Publish(ctx, repo, in.Request("plain"))
	if err != nil || lease != nil || rec.Alias != "plain" {
		t.Fatalf("Publish without a recording: record %+v, lease %v, err %v", rec, lease, err)
	}
	req := in.Request("recorded")
	req.RecordManifest = true
	rec, lease, err = ops.Publish(ctx, repo, req)
	if err != nil || lease == nil || lease.SnapshotID() != rec.ID {
		t.Fatalf("Publish with a recording: record %+v, lease %v, err %v", rec, lease, err)
	}
	select {
	case <-lease.Done():
		t.Fatal("the recording's lease ended before the caller ended it")
	default:
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
}

// TestFailedPublishHoldsNothing: a publish refused (its alias is taken)
// leaves no lease behind, so nothing blocks the next one.
func TestFailedPublishHoldsNothing(t *testing.T) {
	ctx := context.Background()
	repo := openStore(t)
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	if _, _, err := ops.Publish(ctx, repo, in.Request("web")); err != nil {
		t.Fatal(err)
	}
	req := in.Request("web")
	req.RecordManifest = true
	if _, lease, err := ops.Publish(ctx, repo, req); !errors.Is(err, repository.ErrAliasConflict) || lease != nil {
		t.Fatalf("second publish under a held alias: lease %v, err %v", lease, err)
	}
	if _, _, err := ops.Publish(ctx, repo, in.Request("other")); err != nil {
		t.Fatalf("publish after a refused one: %v", err)
	}
}

// TestImportLayoutNamesTheFieldAsTheCallerSaidIt: a layout that does not
// fit is refused in field layout, a memory file no default layout covers
// in field memory, each message starting with the caller's name of the
// field.
func TestImportLayoutNamesTheFieldAsTheCallerSaidIt(t *testing.T) {
	for _, tc := range []struct {
		spec       string
		memBytes   int64
		names      ops.Names
		field, msg string
	}{
		{"0:1GiB", 1 << 20, ops.Flags, "layout", `--layout "0:1GiB" for memory file /m (1048576 bytes): `},
		{"0:1GiB", 1 << 20, ops.JSONFields, "layout", `layout "0:1GiB" for memory file /m (1048576 bytes): `},
		{"", 1000, ops.Flags, "memory", "memory file /m (1000 bytes): "},
	} {
		_, err := ops.ImportLayout(tc.spec, "/m", tc.memBytes, tc.names)
		var fe *ops.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.HasPrefix(err.Error(), tc.msg) {
			t.Errorf("ImportLayout(%q, %d bytes): %v, want field %s and a message starting %q", tc.spec, tc.memBytes, err, tc.field, tc.msg)
		}
	}
	lay, err := ops.ImportLayout("", "/m", 1<<20, ops.Flags)
	if err != nil || lay.MappedSize() != 1<<20 {
		t.Errorf("ImportLayout without a spec: %v, %v", lay, err)
	}
}

// TestShowSaysWhyTheFilesAreMissing: show answers the record of a
// snapshot whose memory file went away, with why its files are not
// listed, instead of failing.
func TestShowSaysWhyTheFilesAreMissing(t *testing.T) {
	ctx := context.Background()
	repo := openStore(t)
	rec, lease := repotest.Publish(t, repo, "web")
	lease.End()
	info, err := ops.Show(ctx, repo, trust.NewPolicy(), "web")
	if err != nil || info.ID != rec.ID || info.Files == nil || info.FilesError != "" {
		t.Fatalf("show of a whole snapshot: %+v, %v", info, err)
	}
	res, err := repo.Resolve(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(res.MemoryPath); err != nil {
		t.Fatal(err)
	}
	info, err = ops.Show(ctx, repo, trust.NewPolicy(), "web")
	if err != nil || info.ID != rec.ID || info.Files != nil || info.FilesError == "" {
		t.Fatalf("show of a snapshot without its memory file: %+v, %v", info, err)
	}
}

// TestUnknownSnapshotIsASnapshotError: an operation named a snapshot that
// does not exist says so as a *SnapshotError keeping the repository's
// sentinel, before it touches anything else of the node.
func TestUnknownSnapshotIsASnapshotError(t *testing.T) {
	ctx := context.Background()
	n := &node.Node{Repo: openStore(t)}
	var se *ops.SnapshotError
	if _, _, err := ops.Restore(ctx, n, "nope", restore.Options{}, ops.Flags); !errors.As(err, &se) || !errors.Is(err, repository.ErrNotFound) || se.Ref != "nope" {
		t.Errorf("Restore of an unknown snapshot: %v", err)
	}
	if _, err := ops.RecordManifest(ctx, n, "nope", nil); !errors.As(err, &se) || !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("RecordManifest of an unknown snapshot: %v", err)
	}
	if err := ops.Sign(ctx, n.Repo, ops.Signer{}, "nope", false, nil); !errors.As(err, &se) || !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("Sign of an unknown snapshot: %v", err)
	}
}

// A publish refused for its input names no snapshot id: none was created.
func TestRefusedPublishNamesNoID(t *testing.T) {
	repo := openStore(t)
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	req := in.Request("web")
	req.VMStatePath = filepath.Join(t.TempDir(), "absent")
	_, _, err := ops.Publish(context.Background(), repo, req)
	if !errors.Is(err, repository.ErrInvalidRequest) || regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-`).MatchString(err.Error()) {
		t.Errorf("publish of an absent vm state: %v; want an invalid request naming no id", err)
	}
}
