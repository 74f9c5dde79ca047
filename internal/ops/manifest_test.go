package ops

import (
	"context"
	"errors"
	"os"
	"testing"

	"warmstart/internal/repository"
)

// TestManifestRefNamingADirectoryIsASnapshot: manifest inspect ref, run
// where a directory named ref exists (the reference snapshot's synth
// output, say), looks up the snapshot ref instead of failing to read the
// directory as a manifest file.
func TestManifestRefNamingADirectoryIsASnapshot(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.Mkdir("ref", 0o755); err != nil {
		t.Fatal(err)
	}
	asked := errors.New("repository consulted")
	_, _, _, err := InspectManifest(context.Background(), "ref", func() (repository.Repository, error) { return nil, asked })
	if !errors.Is(err, asked) {
		t.Fatalf("InspectManifest(ref) with a directory ref present = %v, want the snapshot looked up", err)
	}
}
