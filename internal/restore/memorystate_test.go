package restore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"warmstart/internal/restore"
)

// TestNotReadyNamesMemoryStillWaiting: a guest stuck on a fault that its
// memory source never answers makes the restore fail when it does not get
// ready in time, and the failure says that memory reads were still in
// progress, which the VMM's own "not ready in time" cannot.
func TestNotReadyNamesMemoryStillWaiting(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	gate := e.holdReadsAt(t, e.manifest(t).Ranges[0].Offset)
	// The held read returns once the restore has given up and stopped
	// its VM: the device is then released in the seed's order.
	go func() {
		<-gate.arrived
		if all := e.vm.all(); len(all) > 0 {
			<-all[len(all)-1].Exited()
		}
		gate.open()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	inst, err := e.restorer.Restore(ctx, src, restore.Options{Prefetch: restore.ModeOff})
	if err == nil {
		inst.Stop(context.Background())
		t.Fatal("a restore whose guest waited on memory for ever got ready")
	}
	if !strings.Contains(err.Error(), "memory reads still in progress on the device") {
		t.Fatalf("restore failed with %v; want it to say that memory reads were still in progress", err)
	}
}
