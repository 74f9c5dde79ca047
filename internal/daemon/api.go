package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"syscall"

	"warmstart/internal/api"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/ops"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/snapcheck"
	"warmstart/internal/startupset"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// running is a restore the daemon holds.
type running struct {
	info api.RestoreInfo
	inst *restore.Instance
	// pause is its pause in progress, guarded by Daemon.mu (pause.go).
	pause pauseGate
}

// current is the restore's info with its VM's state as of now.
func (r *running) current() api.RestoreInfo {
	info := r.info
	info.State = r.inst.State()
	if st, ok := r.inst.Exit(); ok {
		info.Exit = &st
	}
	return info
}

func (d *Daemon) healthz(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, d.health())
	return nil
}

// refError maps a repository error about the snapshot named in field.
func refError(field, ref string, err error) error {
	switch {
	case errors.Is(err, repository.ErrNotFound):
		return statusError(http.StatusNotFound, field, fmt.Errorf("snapshot %s: %w", ref, repository.ErrNotFound))
	case errors.Is(err, repository.ErrInvalidRequest):
		return statusError(http.StatusBadRequest, field, err)
	case errors.Is(err, repository.ErrAliasConflict), errors.Is(err, repository.ErrHasDependents):
		// A snapshot whose children read its layers: delete or flatten them first.
		return statusError(http.StatusConflict, field, err)
	case errors.Is(err, context.Canceled):
		return statusError(http.StatusServiceUnavailable, "", fmt.Errorf("snapshot %s: %w", ref, err))
	}
	return fmt.Errorf("snapshot %s: %w", ref, err)
}

// fieldError is a 400 naming the field of the *ops.FieldError in err's
// chain: the request's value of one field was refused. Any other error is
// returned as it is.
func fieldError(err error) error {
	if fe := (*ops.FieldError)(nil); errors.As(err, &fe) {
		return statusError(http.StatusBadRequest, fe.Field, err)
	}
	return err
}

// checkRef refuses a malformed id or alias before the repository sees it.
func checkRef(field, ref string) error {
	if ref == "" {
		return badRequest(field, "%s is required", field)
	}
	if err := repository.ValidateRef(ref); err != nil {
		return statusError(http.StatusBadRequest, field, err)
	}
	return nil
}

func (d *Daemon) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	var f repository.Filter
	for name, values := range r.URL.Query() {
		v := values[len(values)-1]
		switch name {
		case "alias_prefix":
			f.AliasPrefix = v
		case "has_manifest":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return badRequest(name, "has_manifest %q: want true or false", v)
			}
			f.HasManifest = &b
		default:
			return badRequest(name, "unknown query parameter %q", name)
		}
	}
	if err := repository.ValidateFilter(f); err != nil {
		return statusError(http.StatusBadRequest, "alias_prefix", err)
	}
	rows, damaged, err := ops.List(r.Context(), d.repo, f)
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	for _, dmg := range damaged {
		logDamage(d.log, dmg)
	}
	writeJSON(w, http.StatusOK, rows)
	return nil
}

func (d *Daemon) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("id")
	if err := checkRef("id", ref); err != nil {
		return err
	}
	info, err := ops.Show(r.Context(), d.repo, d.node.Trust, ref)
	if err != nil {
		return refError("id", ref, err)
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (d *Daemon) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("id")
	if err := checkRef("id", ref); err != nil {
		return err
	}
	del, err := ops.Delete(r.Context(), d.repo, ref)
	switch {
	case err != nil:
		return refError("id", ref, err)
	case del.Absent:
		return refError("id", ref, repository.ErrNotFound)
	case del.Released:
		d.log.Info("dangling alias released", "alias", del.Alias, "snapshot", del.ID)
	default:
		d.log.Info("snapshot deleted", "snapshot", del.ID, "alias", del.Alias)
	}
	writeJSON(w, http.StatusOK, api.DeleteResponse{ID: del.ID, Alias: del.Alias, Released: del.Released})
	return nil
}

func (d *Daemon) importSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.ImportRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	in, lay, err := d.checkImport(req)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := d.checkOpen(); err != nil {
		return err
	}
	lease, rec, err := d.publishImport(r.Context(), req, in, lay)
	if err != nil {
		return err
	}
	d.log.Info("snapshot published", "snapshot", rec.ID, "alias", rec.Alias, "memory_bytes", rec.MemorySize)
	resp := api.ImportResponse{Record: rec}
	if lease != nil {
		resp.Recording = d.startRecording(lease)
	}
	writeJSON(w, http.StatusCreated, resp)
	return nil
}

// checkImport validates an import request field by field and opens its
// files (openImportable), returning them with the memory layout the
// request names, so that a bad request is refused before any capture
// lease is taken. The caller closes the files once the publish has ended.
func (d *Daemon) checkImport(req api.ImportRequest) (in importFiles, lay layout.Layout, err error) {
	defer func() {
		if err != nil {
			in.Close()
			in = importFiles{}
		}
	}()
	if in.vmState, err = d.openImportable("vm_state", req.VMState); err != nil {
		return in, lay, err
	}
	if in.memory, err = d.openImportable("memory", req.Memory); err != nil {
		return in, lay, err
	}
	if req.Alias != "" {
		if err := repository.ValidateNewAlias(req.Alias); err != nil {
			return in, lay, statusError(http.StatusBadRequest, "alias", err)
		}
	}
	mem, err := in.memory.Stat()
	if err != nil {
		return in, lay, statusError(http.StatusBadRequest, "memory", fmt.Errorf("memory: %w", err))
	}
	if lay, err = ops.ImportLayout(req.Layout, req.Memory, mem.Size(), ops.JSONFields); err != nil {
		return in, lay, fieldError(err)
	}
	return in, lay, nil
}

// publishImport publishes a checked import (ops.Publish) and returns its
// capture lease still held when the manifest is to be recorded, for the
// recorder; on failure the error carries its status.
func (d *Daemon) publishImport(ctx context.Context, req api.ImportRequest, in importFiles, lay layout.Layout) (repository.Lease, repository.Record, error) {
	rec, lease, err := ops.Publish(ctx, d.repo, repository.PublishRequest{
		VMStatePath: procPath(in.vmState), MemoryPath: procPath(in.memory), Layout: lay, Alias: req.Alias, Link: req.Link,
		RecordManifest: d.cfg.Manifest.RecordAfterPublish,
	})
	if err == nil {
		return lease, rec, nil
	}
	err = in.namedAsSent(err, req)
	if d.reqCtx.Err() != nil {
		// Shutdown cut the copy short: the import may be sent again, to
		// this daemon once it is back or to another.
		return nil, repository.Record{}, shuttingDown(fmt.Errorf("import: %w", err))
	}
	if errors.Is(err, repository.ErrAliasConflict) {
		return nil, repository.Record{}, statusError(http.StatusConflict, "alias", err)
	}
	if fe := (*repository.FieldError)(nil); errors.As(err, &fe) && errors.Is(err, repository.ErrInvalidRequest) {
		return nil, repository.Record{}, statusError(http.StatusBadRequest, fe.Field, err)
	}
	if errors.Is(err, repository.ErrInvalidRequest) {
		// No field of the request is at fault: the daemon's own asking.
		return nil, repository.Record{}, fmt.Errorf("import: %w", err)
	}
	if req.Link && errors.Is(err, syscall.EXDEV) {
		// A hard link cannot cross file systems: the request's to change.
		return nil, repository.Record{}, statusError(http.StatusBadRequest, "link", fmt.Errorf("import: %w (link works only on the store's file system)", err))
	}
	return nil, repository.Record{}, fmt.Errorf("import: %w", err)
}

// startRecording records the manifest of the leased snapshot in the
// background and ends the lease when done. It reports false, ending the
// lease at once, when the daemon is shutting down.
func (d *Daemon) startRecording(lease repository.Lease) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		lease.End()
		return false
	}
	job := d.recorder.Start(d.recCtx, lease)
	d.recordings[job] = lease.SnapshotID()
	go func() {
		<-job.Done()
		d.mu.Lock()
		delete(d.recordings, job)
		d.mu.Unlock()
	}()
	return true
}

// verifySnapshot reads every artifact of the snapshot and answers the
// report: 200 whether or not it found problems (the report's ok says), 404
// for an unknown snapshot.
func (d *Daemon) verifySnapshot(w http.ResponseWriter, r *http.Request) error {
	var req api.VerifyRequest
	if err := decodeOptionalJSON(w, r, &req); err != nil {
		return err
	}
	ref := r.PathValue("id")
	if err := checkRef("id", ref); err != nil {
		return err
	}
	if err := d.checkOpen(); err != nil {
		return err
	}
	rep, err := ops.Verify(r.Context(), d.repo, ref, snapcheck.Options{AddDigests: req.AddDigests, Cache: req.Cache == nil || *req.Cache,
		Trust: d.node.Trust})
	switch {
	case err != nil && d.reqCtx.Err() != nil:
		return shuttingDown(err)
	case err != nil:
		return refError("id", ref, err)
	}
	d.logVerified(rep)
	writeJSON(w, http.StatusOK, rep)
	return nil
}

func (d *Daemon) logVerified(rep snapcheck.Report) {
	if rep.DigestsAdded != nil {
		d.log.Info("digest table added", "snapshot", rep.ID, "sha256", rep.DigestsAdded.SHA256)
	}
	if !rep.OK {
		d.log.Warn("snapshot verification found problems", "snapshot", rep.ID, "alias", rep.Alias)
		return
	}
	d.log.Info("snapshot verified", "snapshot", rep.ID, "alias", rep.Alias, "unverified", rep.Unverified)
}

func (d *Daemon) snapshotAction(w http.ResponseWriter, r *http.Request) error {
	if action := r.PathValue("action"); action != "manifest:record" {
		return statusError(http.StatusNotFound, "path", fmt.Errorf("no snapshot action %q (known: manifest:record, verify)", action))
	}
	// It takes no options: a body with any key is refused naming it, not
	// ignored, as on every route.
	var none struct{}
	if err := decodeOptionalJSON(w, r, &none); err != nil {
		return err
	}
	if err := d.checkOpen(); err != nil {
		return err
	}
	ref := r.PathValue("id")
	if err := checkRef("id", ref); err != nil {
		return err
	}
	res, err := ops.RecordManifest(r.Context(), d.node, ref, nil)
	var se *ops.SnapshotError
	switch {
	case errors.As(err, &se):
		return refError("id", ref, se.Err)
	case errors.Is(err, recorder.ErrDiscarded):
		return statusError(http.StatusNotFound, "id", err)
	case errors.Is(err, trust.ErrUntrusted):
		return statusError(http.StatusForbidden, "id", err)
	case err != nil && d.reqCtx.Err() != nil:
		return shuttingDown(err)
	case err != nil:
		return err
	}
	d.log.Info("startup manifest attached", "snapshot", res.SnapshotID, "sha256", res.Descriptor.SHA256, "ranges", res.Ranges, "bytes", res.Bytes,
		res.RecordingAttr())
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (d *Daemon) checkOpen() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return shuttingDown(nil)
	}
	return nil
}

func (d *Daemon) createRestore(w http.ResponseWriter, r *http.Request) error {
	var req api.RestoreRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	opts, err := d.restoreOptions(&req)
	if err != nil {
		return err
	}
	if err := d.checkOpen(); err != nil {
		return err
	}
	ctx := r.Context()
	inst, info, err := ops.Restore(ctx, d.node, req.Snapshot, opts, ops.JSONFields)
	if se := (*ops.SnapshotError)(nil); errors.As(err, &se) {
		return refError("snapshot", req.Snapshot, se.Err)
	}
	if errors.Is(err, ops.ErrNoManifest) {
		return statusError(http.StatusConflict, "prefetch", err)
	}
	if err != nil {
		return d.restoreFailed(err)
	}
	if testHookRestoreReady != nil {
		testHookRestoreReady(ctx)
	}
	run := &running{inst: inst, info: info}
	if err := d.register(ctx, run); err != nil {
		return err
	}
	d.log.Info("restore ready", "restore", inst.ID, "snapshot", info.Snapshot, "device", opts.Device, "generation", inst.Generation,
		"ready", inst.Timings.Ready, "prefetch", inst.Prefetch.State, "reason", inst.Prefetch.Reason, "manifest", inst.Prefetch.Manifest,
		"phases", inst.Timings, "startup_set", inst.StartupSet, "outcome", startupset.Line(inst.StartupSet))
	writeJSON(w, http.StatusCreated, run.current())
	return nil
}

// testHookRestoreReady, set by tests, runs with the request's context
// once a restore is ready, before the daemon takes it in.
var testHookRestoreReady func(context.Context)

// statusClientClosedRequest is the status logged for a request whose
// client went away before its answer (nginx's 499): nobody reads it.
const statusClientClosedRequest = 499

// restoreFailed is the answer to a restore that failed: a request this
// snapshot cannot take (an io_engine other than the one its held device
// generation serves) is the client's to change, and names the field.
func (d *Daemon) restoreFailed(err error) error {
	switch {
	case d.reqCtx.Err() != nil:
		return shuttingDown(err)
	case errors.Is(err, trust.ErrUntrusted):
		return statusError(http.StatusForbidden, "snapshot", err)
	case errors.Is(err, memdev.ErrConflict):
		return statusError(http.StatusConflict, "io_engine", err)
	case errors.Is(err, vmm.ErrForeignState):
		// The snapshot and the daemon's [vmm] driver disagree: a conflict
		// with the configuration, decided before anything started.
		return statusError(http.StatusConflict, "snapshot", err)
	}
	return err
}

// restoreOptions checks a restore request, fills what it leaves out from
// the configuration, and returns the restore's options; a bad field is a
// 400 naming it.
func (d *Daemon) restoreOptions(req *api.RestoreRequest) (restore.Options, error) {
	if err := checkRef("snapshot", req.Snapshot); err != nil {
		return restore.Options{}, err
	}
	opts, err := ops.RestoreOptions(d.cfg, *req, ops.JSONFields)
	if err != nil {
		return restore.Options{}, fieldError(err)
	}
	// Before anything starts: a driver without the device's backend
	// would fail only once the device is up and the VMM started.
	check := func(b vmm.Backend) error { return vmm.CheckBackend(d.node.VMM, b) }
	if err := ops.CheckDeviceBackend(opts.Device, req.Device != "", check, ops.JSONFields); err != nil {
		return restore.Options{}, fieldError(err)
	}
	return opts, nil
}

// register lists a ready restore and takes the daemon's hold on its
// device, together, unless shutdown has begun: shutdown has then collected
// the restores it stops, so this one is stopped here.
func (d *Daemon) register(ctx context.Context, run *running) error {
	if d.clientGone(ctx) {
		// The client went away (a timeout, a CLI killed mid-request)
		// while the restore started: nobody has its id to stop it. A
		// client that leaves after this point has its answer on the way;
		// the CLI stops what it does not hold even when interrupted.
		d.log.Warn("restore abandoned by its client", "restore", run.info.ID, "snapshot", run.info.Snapshot)
		d.stopRestore(context.WithoutCancel(ctx), run)
		return statusError(statusClientClosedRequest, "", fmt.Errorf("restore %s: the client went away before the answer; stopped", run.info.ID))
	}
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		d.stopRestore(context.WithoutCancel(ctx), run)
		return shuttingDown(nil)
	}
	d.countDevice(run)
	d.restores[run.info.ID] = run
	d.mu.Unlock()
	return nil
}

func (d *Daemon) listRestores(w http.ResponseWriter, _ *http.Request) error {
	d.mu.Lock()
	out := make([]api.RestoreInfo, 0, len(d.restores))
	for _, r := range d.restores {
		out = append(out, r.current())
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b api.RestoreInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (d *Daemon) getRestore(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	d.mu.Lock()
	run, ok := d.restores[id]
	d.mu.Unlock()
	if !ok {
		return statusError(http.StatusNotFound, "id", fmt.Errorf("no restore %q", id))
	}
	writeJSON(w, http.StatusOK, run.current())
	return nil
}

func (d *Daemon) deleteRestore(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	d.mu.Lock()
	run, ok := d.restores[id]
	delete(d.restores, id)
	d.mu.Unlock()
	if !ok {
		return statusError(http.StatusNotFound, "id", fmt.Errorf("no restore %q", id))
	}
	// A client that goes away must not leave a stop half done.
	rep, err := d.stopAndRelease(context.WithoutCancel(r.Context()), run)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.StopResponse{ID: id, StopReport: rep})
	return nil
}

// stopAndRelease stops a restore taken out of d.restores and then drops
// its hold on the device, which releases the device after the last restore
// on it; the release's acknowledgement is part of the report.
func (d *Daemon) stopAndRelease(ctx context.Context, run *running) (restore.StopReport, error) {
	rep, err := d.stopRestore(ctx, run)
	ctx, cancel := context.WithTimeout(ctx, d.stopWithin)
	defer cancel()
	ack, relErr := d.releaseDevice(ctx, deviceOf(run))
	rep.ReleaseAck += ack
	return rep, errors.Join(err, relErr)
}

// stopRestore stops a restore in the seed's order, once a pause of it in
// progress has ended (awaitPause): stop the VM, wait for the prefetch
// reads, drop the restore's device reference.
func (d *Daemon) stopRestore(ctx context.Context, run *running) (restore.StopReport, error) {
	d.awaitPause(ctx, run)
	ctx, cancel := context.WithTimeout(ctx, d.stopWithin)
	defer cancel()
	id := run.info.ID
	d.log.Info("stopping restore", "restore", id, "snapshot", run.info.Snapshot)
	rep, err := run.inst.StopReported(ctx)
	if err != nil {
		d.log.Error("restore stop failed", "restore", id, "err", err)
		return rep, err
	}
	attrs := []any{"restore", id, "prefetch_drain", rep.PrefetchDrain}
	if rep.Exit != nil {
		attrs = append(attrs, "vm_had_exited", rep.Exit.String())
	}
	d.log.Info("restore stopped", attrs...)
	return rep, nil
}
