package qemu

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// A QEMU that exits before its monitor greets leaves the connection in the
// backlog of a socket the node listens on: the dial must end with the
// process, not wait for a greeting that never comes.
func TestMonitorDialEndsWhenQEMUExits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	exited := make(chan struct{})
	close(exited)
	mon, err := dialMonitor(context.Background(), path, exited)
	if err == nil {
		mon.close()
		t.Fatal("dial answered without a QEMU")
	}
	if !strings.Contains(err.Error(), "exited") {
		t.Fatalf("error %v, want one saying QEMU exited", err)
	}
}
