package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/api"
)

// A snapshot another VMM took (here a QEMU migration stream) is refused by
// a daemon whose driver is the replay VMM: a 409 on the snapshot field,
// saying what the state is and the driver key, and nothing left running.
func TestRestoreOfAnotherVMMsSnapshotIsA409(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	state := filepath.Join(f.dir, "qemu_state.bin")
	if err := os.WriteFile(state, []byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	req := f.importRequest("captured-by-qemu")
	req.VMState = state
	if _, err := r.client.Import(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "captured-by-qemu", Device: "file", Prefetch: "off"})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Field != "snapshot" ||
		!strings.Contains(ae.Message, `[vmm] driver = "replay"`) || !strings.Contains(ae.Message, "QEMU migration stream") {
		t.Fatalf("restore of a QEMU snapshot under the replay VMM = %v; want a 409 on snapshot naming the driver and the format", err)
	}
	if list, err := r.client.Restores(ctx); err != nil || len(list) != 0 {
		t.Fatalf("restores after the refusal = %+v, %v; want none", list, err)
	}
}
