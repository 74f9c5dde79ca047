package bench

import (
	"errors"
	"fmt"
	"sync"

	"warmstart/internal/config"
	"warmstart/internal/restore"
)

// MaxConcurrency bounds --concurrency: each restore is a VMM process.
const MaxConcurrency = 16

// validateConcurrency checks --concurrency: 1..MaxConcurrency (0 is 1),
// with the replay VMM, whose every restore checks what its guest read,
// and without learned columns, which learn from one restore per trial.
func (o *Options) validateConcurrency() error {
	switch {
	case o.Concurrency <= 1 && o.Concurrency >= 0:
		return nil
	case o.Concurrency < 0 || o.Concurrency > MaxConcurrency:
		return fmt.Errorf("bench: --concurrency %d: want 1..%d", o.Concurrency, MaxConcurrency)
	case o.VMM != "" && o.VMM != config.DriverReplay:
		return fmt.Errorf("bench: --concurrency %d: needs the replay VMM", o.Concurrency)
	}
	for _, p := range o.Policies {
		if learned(p) {
			return fmt.Errorf("bench: --concurrency %d: column %q learns from one restore per trial", o.Concurrency, p)
		}
	}
	return nil
}

// restoreConcurrently starts TrialSpec.Concurrency timed restores of src
// at once on the trial's node (one restorer: they share the device
// generation and the prefetch task, as a daemon's would) and returns them
// once every one is ready, the first started first. When one fails, the
// others are stopped and its error returned.
func (t *trial) restoreConcurrently(src restore.Source, opts restore.Options) ([]*restore.Instance, error) {
	n := max(t.spec.Concurrency, 1)
	insts := make([]*restore.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { insts[i], errs[i] = t.r.Restore(t.ctx, src, opts) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		var ok []*restore.Instance
		for _, in := range insts {
			if in != nil {
				ok = append(ok, in)
			}
		}
		return nil, errors.Join(err, t.stopAll(ok))
	}
	return insts, nil
}

// stopAll stops the instances in order, joining their errors.
func (t *trial) stopAll(insts []*restore.Instance) error {
	var errs []error
	for _, in := range insts {
		errs = append(errs, in.Stop(t.stopCtx))
	}
	return errors.Join(errs...)
}
