package ops

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
	"warmstart/internal/trust"
)

// Signer is what `snapshot sign` signs with and trusts.
type Signer struct {
	Key trust.Key
	// Policy is the node's trusted keys: a record one of them signed is
	// signed again without reading its artifacts.
	Policy *trust.Policy
	// Progress reports the reads of artifacts being checked.
	Progress func(snapcheck.Progress)
}

// Signed is the outcome of signing one snapshot: How its contents were
// vouched for, or Err why it was not signed.
type Signed struct {
	ID, How string
	Err     error
}

// Sign adds s's signature to the record of the snapshot ref names (every
// snapshot with all), each once its bytes are known to be the record's:
// a key of the node's policy signed it as it is, or its artifacts were
// read whole and matched (snapcheck, which also gives a record without a
// SHA-256 digest table one first). each is told of every snapshot as it
// is done; a snapshot it did not sign is an error, after the others were
// tried.
func Sign(ctx context.Context, repo repository.Repository, s Signer, ref string, all bool, each func(Signed)) error {
	recs, err := signTargets(ctx, repo, ref, all)
	if err != nil {
		return err
	}
	var failed []error
	for _, rec := range recs {
		how, err := s.signOne(ctx, repo, rec)
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("snapshot sign %s: interrupted: %w", rec.ID, err)
		}
		if err != nil {
			err = fmt.Errorf("snapshot sign %s: %w", rec.ID, err)
			failed = append(failed, err)
		}
		each(Signed{ID: rec.ID, How: how, Err: err})
	}
	if len(failed) > 0 {
		return fmt.Errorf("snapshot sign: %d of %d snapshots not signed: %w", len(failed), len(recs), errors.Join(failed...))
	}
	return nil
}

func signTargets(ctx context.Context, repo repository.Repository, ref string, all bool) ([]repository.Record, error) {
	if all {
		recs, err := repo.List(ctx, repository.Filter{})
		if err != nil {
			return nil, fmt.Errorf("snapshot sign: %w", err)
		}
		return recs, nil
	}
	rec, err := repo.Lookup(ctx, ref)
	if err != nil {
		return nil, &SnapshotError{ref, err}
	}
	return []repository.Record{rec}, nil
}

// signOne signs rec and says how its contents were vouched for.
func (s Signer) signOne(ctx context.Context, repo repository.Repository, rec repository.Record) (string, error) {
	how := ""
	if st := s.Policy.Status(rec); st.State == trust.StateVerified {
		how = "already signed by trusted key " + st.Key
	} else {
		checked, err := s.check(ctx, repo, rec)
		if err != nil {
			return "", err
		}
		rec, how = checked, "its artifacts read whole and found to match the record"
	}
	sig, err := repository.Sign(rec, s.Key.Private)
	if err != nil {
		return "", err
	}
	lease, err := repo.LeaseExisting(ctx, rec.ID)
	if err != nil {
		return "", err
	}
	err = repo.AttachSignature(ctx, lease, sig)
	if errors.Is(err, repository.ErrStale) {
		err = fmt.Errorf("%w (run snapshot sign again)", err)
	}
	return how, errors.Join(err, lease.End())
}

// check reads every artifact of rec (giving it a SHA-256 digest table if
// it has none or a CRC-32C one) and returns the record the read vouches
// for: rec, with the table added. A problem, or a record that changed
// otherwise meanwhile, is an error: signing would vouch for bytes nobody
// checked.
func (s Signer) check(ctx context.Context, repo repository.Repository, rec repository.Record) (repository.Record, error) {
	rep, err := snapcheck.Verify(ctx, repo, rec.ID, snapcheck.Options{AddDigests: true, Progress: s.Progress})
	if err != nil {
		return repository.Record{}, err
	}
	if !rep.OK {
		return repository.Record{}, fmt.Errorf("not signed: `warmstart snapshot verify %s` finds problems (%s)", rec.ID, firstProblem(rep))
	}
	now, err := repo.Get(ctx, rec.ID)
	if err != nil {
		return repository.Record{}, err
	}
	checked := rec
	if rep.DigestsAdded != nil {
		checked.MemoryDigests = rep.DigestsAdded
	}
	want, err := repository.SignedCore(checked)
	if err != nil {
		return repository.Record{}, err
	}
	if got, err := repository.SignedCore(now); err != nil || !bytes.Equal(got, want) {
		return repository.Record{}, fmt.Errorf("%w: the record changed while its artifacts were read (run snapshot sign again)", repository.ErrStale)
	}
	return now, nil
}

// firstProblem names the first problem of a report.
func firstProblem(rep snapcheck.Report) string {
	if len(rep.Problems) > 0 {
		return rep.Problems[0].Message
	}
	for _, a := range rep.Artifacts {
		if len(a.Problems) > 0 {
			return a.Name + ": " + a.Problems[0].Message
		}
	}
	return "no problem named"
}
