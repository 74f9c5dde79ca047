package daemon

import (
	"context"
	"log/slog"
	"time"

	"warmstart/internal/repository"
)

// resumeRecordings starts again, once at start, the background recording
// of every snapshot whose publisher recorded its startup manifest in the
// background (Record.ManifestRequested: published while
// [manifest] record_after_publish was true) that has no manifest and
// no recording in progress (no capture lease held). Such a recording died
// with its process, a kill -9 or a crash after the publish, and nothing
// else would ever finish it. Each one is logged. The snapshot is claimed
// (repository.ClaimLease), so a recording another daemon runs, or resumes
// at the same moment, is left to it. While any is left to another holder,
// the daemon looks again every retryEvery until it stops: that holder may
// have crashed, and its lease expires only after a while (S3) rather than
// with its process.
func (d *Daemon) resumeRecordings(ctx context.Context) {
	if d.resumeOnce(ctx) > 0 {
		go d.retryResume(ctx)
	}
}

func (d *Daemon) retryResume(ctx context.Context) {
	tick := time.NewTicker(d.retryEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if d.resumeOnce(ctx) == 0 {
			return
		}
	}
}

// resumeOnce resumes the interrupted recordings it can claim and returns
// how many it left to another holder.
func (d *Daemon) resumeOnce(ctx context.Context) (leftToOthers int) {
	without := false
	recs, err := d.repo.List(ctx, repository.Filter{HasManifest: &without})
	if err != nil {
		d.log.Error("resume manifest recordings: list snapshots", "err", err)
		return 0
	}
	for _, rec := range recs {
		if !rec.ManifestRequested {
			continue
		}
		lease, claimed, err := d.repo.ClaimLease(ctx, rec.ID)
		switch {
		case err != nil:
			d.log.Error("resume manifest recording", "snapshot", rec.ID, "err", err)
			continue
		case !claimed:
			d.log.Info("manifest recording in progress elsewhere", "snapshot", rec.ID)
			leftToOthers++
			continue
		}
		d.log.Info("resuming interrupted manifest recording", "snapshot", rec.ID, "alias", rec.Alias)
		d.startRecording(lease)
	}
	return leftToOthers
}

// reportDamage logs, once at start, every damaged catalog entry (the
// writable open before it has moved those in place to the quarantine):
// they stay until an operator resolves them, and an alias they hold stays
// taken.
func (d *Daemon) reportDamage(ctx context.Context) {
	damaged, err := d.repo.Damaged(ctx)
	if err != nil {
		d.log.Error("check catalog", "err", err)
		return
	}
	for _, dmg := range damaged {
		logDamage(d.log, dmg)
	}
}

func logDamage(log *slog.Logger, dmg repository.Damage) {
	log.Warn("damaged catalog entry", "kind", dmg.Kind, "name", dmg.Name, "quarantined", dmg.Quarantined,
		"location", dmg.Location, "reason", dmg.Reason)
}
