package local

import (
	"context"
	"errors"
	"fmt"

	"warmstart/internal/node"
	"warmstart/internal/ops"
	"warmstart/internal/recorder"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
)

// RecordManifest records the startup manifest of the snapshot ref names
// now, holding a lease on it, and attaches it.
func RecordManifest(ctx context.Context, n *node.Node, o report.Output, ref string) error {
	res, err := ops.RecordManifest(ctx, n, ref, func(id string) {
		fmt.Fprintf(o.Err, "recording %s on the %s device...\n", id, n.Config.Memory.Device)
	})
	if se := (*ops.SnapshotError)(nil); errors.As(err, &se) {
		return fmt.Errorf("record-manifest %s: %w", ref, se.Err)
	}
	if err != nil {
		return err
	}
	report.Recorded(o.Out, res)
	return nil
}

// ImportAndRecord publishes a snapshot, prints its id, and records its
// startup manifest under the held capture lease, waiting for it (progress
// on o.Err).
func ImportAndRecord(ctx context.Context, n *node.Node, o report.Output, req repository.PublishRequest) error {
	req.RecordManifest = true
	rec, lease, err := ops.Publish(ctx, n.Repo, req)
	if err != nil {
		return fmt.Errorf("snapshot import: %w", err)
	}
	job := n.Recorder.Start(ctx, lease)
	fmt.Fprintln(o.Out, rec.ID)
	fmt.Fprintf(o.Err, "recording the startup manifest of %s on the %s device; waiting for it\n", rec.ID, n.Config.Memory.Device)
	res, err := job.Result()
	if err != nil {
		// The snapshot is published and restores with on-demand reads.
		return notRecorded(rec.ID, err)
	}
	fmt.Fprintf(o.Err, "attached startup manifest to %s: sha256 %s, %d ranges, %.1f MiB, ready after %v; %s\n",
		rec.ID, res.Descriptor.SHA256, res.Ranges, float64(res.Bytes)/(1<<20), res.ReadyAfter, report.RecordingLine(res.Recording, res.Fallback))
	return nil
}

// CheckCapture refuses capture flags no capture can use, before anything
// starts; its errors name the flag, and the CLI reports them as usage
// errors.
func CheckCapture(kind, agent, alias string) error {
	switch kind {
	case "qemu":
	case "firecracker":
		if agent != "" {
			return errors.New("--agent: a Firecracker guest's agent comes with its [firecracker] rootfs")
		}
	default:
		return fmt.Errorf("--vmm %q: only qemu and firecracker boot and capture a guest", kind)
	}
	if alias != "" {
		if err := repository.ValidateAlias(alias); err != nil {
			return fmt.Errorf("capture: --alias: %w", err)
		}
	}
	return nil
}

// Capture boots, captures and publishes a guest on the node's VMM (kind
// names it), waits for its manifest's recording when there is one, and
// prints the result.
func Capture(ctx context.Context, n *node.Node, o report.Output, alias, agent, kind string, asJSON bool) error {
	out, job, err := ops.Capture(ctx, n, alias, agent, o.Err)
	if err != nil {
		return err
	}
	var rec *recorder.Result
	var recErr error
	if job != nil {
		fmt.Fprintln(o.Err, "recording the startup manifest in the background; waiting for it")
		r, err := job.Result()
		rec, recErr = &r, err
	}
	if asJSON {
		err = report.CaptureJSON(o.Out, out, rec, recErr)
	} else {
		report.CaptureText(o.Out, kind, out, rec, recErr)
	}
	if err != nil {
		return err
	}
	if recErr != nil {
		// The snapshot is published and restores with on-demand reads.
		return notRecorded(out.Record.ID, recErr)
	}
	return nil
}

// notRecorded is the error of a published snapshot whose startup
// manifest recording failed with err: a recording discarded because the
// snapshot was deleted meanwhile says so.
func notRecorded(id string, err error) error {
	if errors.Is(err, recorder.ErrDiscarded) {
		return fmt.Errorf("snapshot %s was published, then deleted (or its capture lease lost) before its startup manifest could be attached: %w", id, err)
	}
	return fmt.Errorf("snapshot %s published, but its startup manifest was not: %w", id, err)
}

// Verify verifies the snapshot ref names, or with all every snapshot, and
// prints the reports; it fails when any found a problem.
func Verify(ctx context.Context, repo repository.Repository, o report.Output, ref string, all, asJSON bool, opts snapcheck.Options) error {
	opts.Progress = report.VerifyProgress(o.Err)
	if all {
		reports, err := ops.VerifyAll(ctx, repo, opts)
		if err != nil {
			return fmt.Errorf("snapshot verify --all: %w", err)
		}
		return report.VerifyReports(o.Out, reports, asJSON, "")
	}
	rep, err := ops.Verify(ctx, repo, ref, opts)
	if err != nil {
		return RefError("snapshot verify", ref, err)
	}
	return report.VerifyReports(o.Out, []snapcheck.Report{rep}, asJSON, ref)
}
