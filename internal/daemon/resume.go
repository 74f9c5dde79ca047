package daemon

import (
	"context"
	"log/slog"

	"warmstart/internal/repository"
)

// resumeRecordings starts again, once at start, the background recording
// of every snapshot whose publisher recorded its startup manifest in the
// background (Record.ManifestRequested: published while
// [snapshot.memory_startup_pack] enabled was true) that has no manifest and
// no recording in progress (no capture lease held). Such a recording died
// with its process, a kill -9 or a crash after the publish, and nothing
// else would ever finish it. Each one is logged. The snapshot is claimed
// (repository.ClaimLease), so a recording another daemon runs, or resumes
// at the same moment, is left to it.
func (d *Daemon) resumeRecordings(ctx context.Context) {
	without := false
	recs, err := d.repo.List(ctx, repository.Filter{HasManifest: &without})
	if err != nil {
		d.log.Error("resume manifest recordings: list snapshots", "err", err)
		return
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
			continue
		}
		d.log.Info("resuming interrupted manifest recording", "snapshot", rec.ID, "alias", rec.Alias)
		d.startRecording(lease)
	}
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
