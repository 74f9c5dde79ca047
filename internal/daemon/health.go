package daemon

import (
	"log/slog"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/ops"
	"warmstart/internal/vmm"
)

// Health statuses of GET /healthz.
const (
	healthOK = "ok"
	// healthDegraded: the daemon serves, but restores will fail (the
	// configured VMM cannot run here). The answer stays HTTP 200: the
	// process is alive and its catalog works, and restarting it (what a
	// failing liveness probe does) would not bring the VMM back; the
	// status and reason say what an operator must fix.
	healthDegraded = "degraded"
)

// vmmHealth asks the configured VMM driver, once at start, whether it can
// restore on this host, and whether it can with the configured default
// device (QEMU has no uffd backend: every restore naming no device would
// be refused), and logs the answer; "" means it can. The checks live
// with each driver (vmm.Checker, vmm.BackendChecker).
func vmmHealth(v vmm.VMM, cfg *config.Config, log *slog.Logger) string {
	err := vmm.Check(v)
	if err == nil {
		err = ops.CheckDefaultDevice(cfg, func(b vmm.Backend) error { return vmm.CheckBackend(v, b) })
	}
	if err != nil {
		log.Warn("degraded: restores will fail", "reason", err.Error())
		return err.Error()
	}
	return ""
}

// health is the body of GET /healthz now.
func (d *Daemon) health() api.Health {
	h := api.Health{Status: healthOK, Restores: d.activeRestores()}
	if d.degraded != "" {
		h.Status, h.Reason = healthDegraded, d.degraded
	}
	return h
}
