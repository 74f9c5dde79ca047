package restore

import (
	"log/slog"

	"warmstart/internal/memdev"
	"warmstart/internal/refine"
	"warmstart/internal/residency"
	"warmstart/internal/vmm"
)

// touched is the restore's probe of which pages brought into the guest's
// reach it used: the caller's (Options.Touched), else, on the file device,
// the VMM's page tables at ready (touchedAtReady), else none.
func (s *sequence) touched() refine.Touched {
	if s.opts.Touched != nil {
		return s.opts.Touched
	}
	if pages := s.held.touchedAtReady(s.src.Layout.FileSize); pages != nil {
		return pages.Touched
	}
	return nil
}

// touchedAtReady reads which pages of the memory file the VMM process had
// mapped at ready: on a device the VMM maps as a file (memdev.Mapped), the
// guest's touches of pages that prefetch had already brought in, which
// the device cannot see. It is nil where that cannot be known: a device
// the VMM does not map (one that installs pages into the VM's own memory,
// where every installed page is mapped, touched or not), or a VMM
// that is not one host process. A failure is logged and means "unknown",
// never a failed restore.
func (h *holdings) touchedAtReady(memoryBytes int64) *residency.Pages {
	m, ok := h.dev.(memdev.Mapped)
	if !ok || m.MappedPath() == "" {
		return nil
	}
	proc, ok := h.vm.(vmm.Process)
	if !ok {
		return nil
	}
	pages, err := residency.Of(proc.PID(), m.MappedPath(), memoryBytes)
	if err != nil {
		slog.Debug("residency of the VMM unknown", "restore", h.id, "err", err)
		return nil
	}
	return pages
}
