package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/node"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// TestEveryDriverIsWired: every driver key package vmm lists is one the
// VMM factory builds and the verbs' --vmm takes: neither answers it as an
// unknown driver, so a driver added to vmm without its wiring here fails.
func TestEveryDriverIsWired(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "startup.trace")
	if err := os.WriteFile(trace, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, key := range vmm.Drivers() {
		cfg := config.Default()
		cfg.VMM.Driver, cfg.Replay.Trace = key, trace
		cfg.QEMU.Accel = qemu.AccelTCG // no accelerator probe
		cfg.Runtime.Dir = t.TempDir()
		v, err := node.NewVMM(context.Background(), cfg)
		if err != nil && strings.Contains(err.Error(), "[vmm] driver \""+key+"\": want") {
			t.Errorf("NewVMM does not know driver %q: %v", key, err)
		}
		if err == nil && v == nil {
			t.Errorf("NewVMM(%q) built no VMM", key)
		}
		if _, err := node.WithVMM(cfg, key, trace); err != nil && strings.Contains(err.Error(), "--vmm \""+key+"\": want") {
			t.Errorf("WithVMM does not know driver %q: %v", key, err)
		}
	}
}
