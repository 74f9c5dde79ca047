package main

import (
	"errors"

	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/vmm"
)

// newFirecrackerDriver builds the firecracker driver from [firecracker] and
// [envd] exactly as the daemon does. Ready is the guest agent answering, so
// an empty [envd] address is refused here rather than after the first VM
// has started.
func newFirecrackerDriver(cfg *config.Config) (vmm.VMM, error) {
	if cfg.Envd.Address == "" {
		return nil, errors.New("--vmm firecracker: [envd] address is empty; set it to the guest agent's health endpoint (vsock:PORT, unix:PATH or http://HOST:PORT/health)")
	}
	c := *cfg
	c.VMM.Driver = config.DriverFirecracker
	return daemon.NewVMM(&c)
}
