package restore

import (
	"fmt"
	"strings"

	"warmstart/internal/repository"
)

// StallReporter is a remote memory source that can say which of its
// requests the store keeps waiting now (the S3 source: sent and not
// answered, or a body that stopped coming). A restore that fails or
// stops while its reads wait says so: a cancellation alone does not name
// the cause.
type StallReporter interface {
	// Unanswered describes the requests waiting on the store now, nil
	// when there is none.
	Unanswered() error
}

// unanswered is what the restore's memory source reports waiting, nil
// when it cannot tell or nothing waits.
func (h *holdings) unanswered() error {
	if h.stall == nil {
		return nil
	}
	return h.stall.Unanswered()
}

// withMemoryState adds to a restore that did not get ready what the
// memory side knows and the VMM's error cannot say: reads still in
// progress on the device (a lower file or object store that stopped
// answering leaves the guest waiting on a fault, which the VMM reports
// only as "not ready in time"), reads that failed (the VMM reports only
// the fault they caused), and why a remote source went without its
// startup pack (a stalled or failed stream).
func (s *sequence) withMemoryState(err error) error {
	var notes []string
	c := s.held.dev.Counters()
	if c.BytesInFlight > 0 {
		notes = append(notes, fmt.Sprintf("%d bytes of memory reads still in progress on the device: its memory source has not answered them", c.BytesInFlight))
	}
	if c.ReadErrors > 0 {
		notes = append(notes, fmt.Sprintf("memory reads failed on the device (%d), the first: %s", c.ReadErrors, c.FirstReadError))
	}
	if why := s.held.unanswered(); why != nil {
		notes = append(notes, why.Error())
	}
	if p, ok := repository.Capabilities(s.src.Memory).(PackSkipper); ok {
		if skipped := p.StartupPackSkipped(); skipped != nil {
			notes = append(notes, skipped.Error())
		}
	}
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(notes, "; "))
}
