package daemon_test

import (
	"context"
	"strings"
	"testing"

	"warmstart/internal/daemon"
	"warmstart/internal/vmm/firecracker"
)

// With the default Firecracker driver and no Firecracker binary, /healthz
// says degraded and why, instead of ok; the daemon still serves.
func TestHealthzDegradedWithoutTheVMM(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	fc, err := firecracker.New(firecracker.Options{Binary: "/nonexistent/firecracker"})
	if err != nil {
		t.Fatal(err)
	}
	r := startDaemon(t, f, func(o *daemon.Options) { o.VMM = fc })
	h, err := r.client.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != "degraded" || !strings.Contains(h.Reason, "/nonexistent/firecracker") {
		t.Fatalf("healthz = %+v; want degraded naming the missing binary", h)
	}
	select {
	case <-r.log.logged("degraded: restores will fail"):
	default:
		t.Fatal("the degraded state was not logged")
	}
}
