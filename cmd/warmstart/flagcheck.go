package main

import (
	"fmt"

	"warmstart/internal/config"
	"warmstart/internal/restore"
)

// The checks below refuse flag values no restore can use while that is
// still cheap: before a verb opens a repository, mounts a memory device or
// starts a VMM, so that a typo is a usage error (exit 2) that leaves
// nothing behind, not a failure halfway through.

// checkRestoreFlags checks restore's --device, --io-engine and --policy.
// Empty device and policy mean the configured defaults.
func checkRestoreFlags(device string, ioEngine int, policy string) error {
	if device != "" && !config.ValidDevice(device) {
		return usageError{Err: fmt.Errorf("--device %q: want file or uffd", device)}
	}
	if err := checkIOEngineFlag(ioEngine); err != nil {
		return err
	}
	if policy != "" {
		if _, err := restore.LookupPolicy(policy); err != nil {
			return usageError{Err: fmt.Errorf("--policy: %w", err)}
		}
	}
	return nil
}

// checkIOEngineFlag checks an --io-engine value: the memory device knows
// engines 0 and 1 (buffered) and 2 (direct I/O).
func checkIOEngineFlag(n int) error {
	if !config.ValidIOEngine(n) {
		return usageError{Err: fmt.Errorf("--io-engine %d: want 0 or 1 (buffered) or 2 (direct I/O)", n)}
	}
	return nil
}
