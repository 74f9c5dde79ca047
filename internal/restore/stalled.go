package restore

import (
	"fmt"
	"strings"
)

// withMemoryState adds to a restore that did not get ready what the
// memory side knows and the VMM's error cannot say: reads still in
// progress on the device (a lower file or object store that stopped
// answering leaves the guest waiting on a fault, which the VMM reports
// only as "not ready in time"), and why a remote source went without its
// startup pack (a stalled or failed stream).
func (inst *Instance) withMemoryState(err error, src Source) error {
	var notes []string
	if c := inst.device.counters(); c.BytesInFlight > 0 {
		notes = append(notes, fmt.Sprintf("%d bytes of memory reads still in progress on the device: its memory source has not answered them", c.BytesInFlight))
	}
	if s, ok := src.Memory.(PackSkipper); ok {
		if skipped := s.StartupPackSkipped(); skipped != nil {
			notes = append(notes, skipped.Error())
		}
	}
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(notes, "; "))
}
