package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"warmstart/internal/durable"
)

// BootAppend is the guest kernel command line. reboot=t makes a panicking
// guest reset by triple fault, which QEMU (run with -no-reboot) turns into
// an exit, so a guest that dies is noticed at once instead of hanging.
const BootAppend = "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init"

// pollInterval paces query-migrate and query-status while a migration runs.
const pollInterval = 5 * time.Millisecond

// BootSpec is what Boot needs besides the driver's options.
type BootSpec struct {
	// MemPath is the memory file. Boot creates it, or truncates it, to the
	// guest's memory size; the guest's RAM lives in it (share=on).
	MemPath string
	// Initrd is the initramfs holding the agent (see internal/initramfs).
	Initrd string
	// RuntimeDir is a private directory for the machine's sockets and log.
	// The caller creates and removes it.
	RuntimeDir string
}

// Boot starts a fresh guest whose memory is the file spec.MemPath and
// waits until its agent answers. Machine.Ready then holds the agent's
// token and uptime. On error no QEMU process is left.
func (d *Driver) Boot(ctx context.Context, spec BootSpec) (*Machine, error) {
	if spec.MemPath == "" || spec.Initrd == "" || spec.RuntimeDir == "" {
		return nil, errors.New("boot: memory path, initrd and runtime directory are required")
	}
	kernel, err := d.Kernel()
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	accel, err := d.Accel(ctx)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if _, err := os.Stat(spec.Initrd); err != nil {
		return nil, fmt.Errorf("boot: initrd: %w", err)
	}
	memPath, err := filepath.Abs(spec.MemPath)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := createMemoryFile(memPath, d.MemoryBytes()); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	args := machineArgs(accel, d.opts.Machine, d.opts.MemoryMiB, d.opts.VCPUs)
	args = append(args, memoryArgs(d.opts.MemoryMiB, memPath, true)...)
	args = append(args, "-kernel", kernel, "-initrd", spec.Initrd, "-append", d.kernelCmdline())
	m, err := d.start(ctx, spec.RuntimeDir, args)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	m.capturable, m.memPath = true, memPath
	m.resumed = m.started
	if _, err := m.WaitReady(ctx); err != nil {
		m.kill()
		return nil, fmt.Errorf("boot: %w", err)
	}
	return m, nil
}

// kernelCmdline is BootAppend with the agent's workload parameters.
func (d *Driver) kernelCmdline() string {
	if w := d.workload.KernelArgs(); w != "" {
		return BootAppend + " " + w
	}
	return BootAppend
}

// createMemoryFile makes path an all-zero (sparse) file of size bytes.
func createMemoryFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create memory file: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("size memory file %s: %w", path, err)
	}
	return f.Close()
}

// Capture pauses the guest and writes its device state to vmStatePath
// (fsynced); its RAM is already in the memory file Boot mapped. QEMU then
// quits. The memory file's pages are in the page cache, not necessarily on
// disk: whoever publishes it makes it durable. On error the machine is
// killed.
func (m *Machine) Capture(ctx context.Context, vmStatePath string) (err error) {
	if !m.capturable {
		return ErrNotCapturable
	}
	defer func() {
		if err != nil {
			m.kill()
			err = m.withLog(fmt.Errorf("capture: %w", err))
		}
	}()
	if err := m.pauseAndSave(ctx, vmStatePath); err != nil {
		return err
	}
	return m.stop(ctx)
}

// Checkpoint captures the guest and lets it run on, as a fleet snapshots
// a sandbox that keeps serving: it pauses the guest, writes its device
// state to vmStatePath and a copy of its memory file to memCopyPath (both
// fsynced; the copy is sparse, all-zero pages are holes), and continues
// it. The copy is taken while the guest is paused, so it is the memory
// the device state was saved with; the live file goes on changing. On
// error the machine is killed.
func (m *Machine) Checkpoint(ctx context.Context, vmStatePath, memCopyPath string) (err error) {
	if !m.capturable {
		return ErrNotCapturable
	}
	defer func() {
		if err != nil {
			m.kill()
			err = m.withLog(fmt.Errorf("checkpoint: %w", err))
		}
	}()
	if err := m.pauseAndSave(ctx, vmStatePath); err != nil {
		return err
	}
	if err := copySparse(m.memPath, memCopyPath); err != nil {
		return err
	}
	// A completed outgoing migration leaves QEMU in postmigrate, from
	// which cont runs the guest again.
	if err := m.mon.execute(ctx, "cont", nil, nil); err != nil {
		return err
	}
	m.resumed = time.Now()
	return nil
}

// pauseAndSave quiesces the agent, pauses the guest and writes its device
// state (not its RAM, which is in the memory file) to vmStatePath.
func (m *Machine) pauseAndSave(ctx context.Context, vmStatePath string) error {
	path, err := filepath.Abs(vmStatePath)
	if err != nil {
		return err
	}
	// The agent answers pings in order, so once it answers a fresh one it
	// has worked through every ping queued during boot and sits in read:
	// the snapshot holds an idle agent with no input pending.
	if _, err := m.agent.ping(ctx, m.exited); err != nil {
		return fmt.Errorf("quiesce agent: %w", err)
	}
	if err := m.mon.execute(ctx, "stop", nil, nil); err != nil {
		return err
	}
	return m.saveState(ctx, path)
}

// saveState writes a stopped guest's device state, without its shared
// RAM, to path (absolute) and syncs it.
func (m *Machine) saveState(ctx context.Context, path string) error {
	if err := m.mon.ignoreShared(ctx); err != nil {
		return err
	}
	uri := "exec:cat > " + shellQuote(path)
	if err := m.mon.execute(ctx, "migrate", map[string]string{"uri": uri}, nil); err != nil {
		return err
	}
	if err := m.waitMigration(ctx); err != nil {
		return err
	}
	return durable.Sync(path)
}

// waitMigration polls query-migrate until the outgoing migration completes.
func (m *Machine) waitMigration(ctx context.Context) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		var st migrationStatus
		if err := m.mon.execute(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ticker.C:
		case <-m.exited:
			return m.exitError()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// shellQuote quotes s for /bin/sh, which runs QEMU's exec: migrations.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
