package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"syscall"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/snapcheck"
	"warmstart/internal/startupset"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// Error is the body of every answer with a 4xx or 5xx status.
type Error struct {
	Error string `json:"error"`
	// Field names the request field at fault: a JSON field, a path
	// parameter ("id"), a query parameter, or "body" for the body as a whole.
	Field string `json:"field,omitempty"`
}

// Health is the body of GET /healthz (always HTTP 200 while serving).
type Health struct {
	// Status is "ok", or "degraded" when restores will fail: the
	// configured VMM cannot run on this host (Reason says why).
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	Restores int    `json:"restores"`
}

// ImportRequest is the body of POST /snapshots/import: files on the
// daemon's host, given by absolute paths.
type ImportRequest struct {
	VMState string `json:"vm_state"`
	Memory  string `json:"memory"`
	Alias   string `json:"alias,omitempty"`
	// Layout is offset:size[:pagesize],... as layout.Parse reads it; empty
	// means one region over the whole memory file.
	Layout string `json:"layout,omitempty"`
	// Link hard-links the files into the store instead of copying them
	// and makes them read-only: the caller must never write them again.
	Link bool `json:"link,omitempty"`
}

// ImportResponse is the published record.
type ImportResponse struct {
	repository.Record
	// Recording is true when the startup manifest is being recorded in
	// the background ([snapshot.memory_startup_pack] enabled).
	Recording bool `json:"recording"`
}

// SnapshotInfo is the body of GET /snapshots/{id}.
type SnapshotInfo struct {
	repository.Record
	// Files are where the artifacts are on the daemon's host; absent, with
	// FilesError saying why, when they do not check out.
	Files      *SnapshotFiles `json:"files,omitempty"`
	FilesError string         `json:"files_error,omitempty"`
	// Trust is what the daemon's trusted keys make of the record's
	// signatures: verified, refused (restores fail with 403) or
	// unverified (it trusts no key).
	Trust trust.Status `json:"trust"`
}

// SnapshotFiles are a snapshot's artifacts.
type SnapshotFiles struct {
	VMState  string `json:"vm_state"`
	Memory   string `json:"memory"`
	Manifest string `json:"manifest,omitempty"`
}

// DeleteResponse is the body of a successful DELETE /snapshots/{id}.
type DeleteResponse struct {
	ID    string `json:"id"`
	Alias string `json:"alias,omitempty"`
	// Released: the alias named a snapshot that no longer exists (ID),
	// and its binding was released; no snapshot was deleted.
	Released bool `json:"released,omitempty"`
}

// VerifyRequest is the optional body of POST /snapshots/{id}/verify.
type VerifyRequest struct {
	// AddDigests attaches the freshly computed digest tables a snapshot
	// lacks, if its memory file matches the record's SHA-256.
	AddDigests bool `json:"add_digests,omitempty"`
	// Cache, unless false, also checks what the daemon's node cache holds
	// of the snapshot's memory and evicts blocks that fail
	// (snapcheck.Options.Cache).
	Cache *bool `json:"cache,omitempty"`
}

// RestoreRequest is the body of POST /restores. Empty fields take the
// daemon's configuration.
type RestoreRequest struct {
	// Snapshot is an id or alias.
	Snapshot string `json:"snapshot"`
	// Device is "file" or "uffd"; default [memory] device.
	Device string `json:"device,omitempty"`
	// Prefetch is "auto" (the default: [snapshot.memory_startup_pack]
	// consume_enabled), "on" or "off".
	Prefetch string `json:"prefetch,omitempty"`
	// Policy is a prefetch policy name; default [prefetch] policy.
	Policy string `json:"policy,omitempty"`
	// IOEngine is 0, 1 or 2; default [memory] io_engine.
	IOEngine *int `json:"io_engine,omitempty"`
}

// RestoreInfo describes a restore the daemon holds. Prefetch and
// DeviceBytes are as they were at ready.
type RestoreInfo struct {
	ID          string                 `json:"id"`
	Snapshot    string                 `json:"snapshot"`
	Device      string                 `json:"device"`
	IOEngine    int                    `json:"io_engine"`
	Policy      string                 `json:"policy"`
	Generation  uint64                 `json:"generation"`
	StartedAt   time.Time              `json:"started_at"`
	Timings     restore.Timings        `json:"timings"`
	Prefetch    restore.PrefetchReport `json:"prefetch"`
	DeviceBytes memdev.Counters        `json:"device_bytes"`
	// Cost is what the restore cost the host until ready: CPU, faults and
	// storage reads of the node and VMM processes, bytes read and copied.
	Cost restore.Cost `json:"cost"`
	// Passthrough, when true, says the kernel served the guest's memory
	// from the local lower file (FUSE passthrough, [memory] passthrough):
	// no block was checked before the guest saw it.
	Passthrough bool `json:"passthrough,omitempty"`
	// StartupSet accounts for the startup set at ready.
	StartupSet startupset.Report `json:"startup_set"`
	// Ready is what the VMM driver reported at ready (the replay VMM's
	// hash of what it read, a real guest's token).
	Ready map[string]string `json:"ready,omitempty"`
	// State is "running", or "exited" once the VM's process has exited on
	// its own (crashed, killed, shut down by its guest); Exit then says
	// how. An exited restore is held until DELETE releases its device.
	State string           `json:"state"`
	Exit  *vmm.ProcessExit `json:"exit,omitempty"`
}

// StopResponse is the body of DELETE /restores/{id}.
type StopResponse struct {
	ID string `json:"id"`
	restore.StopReport
}

// running is a restore the daemon holds.
type running struct {
	info RestoreInfo
	inst *restore.Instance
}

// current is the restore's info with its VM's state as of now.
// NewRestoreInfo describes a ready restore of snapshot, made with opts
// and started at started. The daemon answers POST /restores with it and
// the CLI prints it for an in-process restore: one schema in both modes.
func NewRestoreInfo(inst *restore.Instance, snapshot string, opts restore.Options, started time.Time) RestoreInfo {
	return RestoreInfo{
		ID: inst.ID, Snapshot: snapshot, Device: opts.Device, IOEngine: opts.IOEngine, Policy: opts.Policy.Name,
		Generation: inst.Generation, StartedAt: started, Timings: inst.Timings, Prefetch: inst.Prefetch,
		DeviceBytes: inst.DeviceBytes, Cost: inst.Cost, Passthrough: inst.Passthrough, Ready: inst.Ready.Detail, State: inst.State(), StartupSet: inst.StartupSet,
	}
}

func (r *running) current() RestoreInfo {
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
	case errors.Is(err, repository.ErrAliasConflict):
		return statusError(http.StatusConflict, field, err)
	case errors.Is(err, context.Canceled):
		return statusError(http.StatusServiceUnavailable, "", fmt.Errorf("snapshot %s: %w", ref, err))
	}
	return fmt.Errorf("snapshot %s: %w", ref, err)
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

func (d *Daemon) lookup(ctx context.Context, field, ref string) (repository.Record, error) {
	if err := checkRef(field, ref); err != nil {
		return repository.Record{}, err
	}
	rec, err := d.repo.Lookup(ctx, ref)
	if err != nil {
		return rec, refError(field, ref, err)
	}
	return rec, nil
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
	rows, damaged, err := repository.Listing(r.Context(), d.repo, f)
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
	rec, err := d.lookup(r.Context(), "id", r.PathValue("id"))
	if err != nil {
		return err
	}
	info := SnapshotInfo{Record: rec, Trust: d.node.Trust.Status(rec)}
	if res, err := d.repo.Resolve(r.Context(), rec.ID); err != nil {
		info.FilesError = err.Error()
	} else {
		info.Files = &SnapshotFiles{VMState: res.VMStatePath, Memory: res.MemoryPath, Manifest: res.ManifestPath}
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (d *Daemon) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("id")
	if err := checkRef("id", ref); err != nil {
		return err
	}
	del, err := repository.DeleteRef(r.Context(), d.repo, ref)
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
	writeJSON(w, http.StatusOK, DeleteResponse{ID: del.ID, Alias: del.Alias, Released: del.Released})
	return nil
}

func (d *Daemon) importSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req ImportRequest
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
	resp := ImportResponse{Record: rec}
	if d.cfg.Snapshot.MemoryStartupPack.Enabled {
		resp.Recording = d.startRecording(lease)
	} else if err := lease.End(); err != nil {
		return fmt.Errorf("import %s: end capture lease: %w", rec.ID, err)
	}
	writeJSON(w, http.StatusCreated, resp)
	return nil
}

// checkImport validates an import request field by field and opens its
// files (openImportable), returning them with the memory layout the
// request names, so that a bad request is refused before any capture
// lease is taken. The caller closes the files once the publish has ended.
func (d *Daemon) checkImport(req ImportRequest) (in importFiles, lay layout.Layout, err error) {
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
		if err := repository.ValidateAlias(req.Alias); err != nil {
			return in, lay, statusError(http.StatusBadRequest, "alias", err)
		}
	}
	mem, err := in.memory.Stat()
	if err != nil {
		return in, lay, statusError(http.StatusBadRequest, "memory", fmt.Errorf("memory: %w", err))
	}
	if lay, err = layout.Parse(req.Layout, mem.Size()); err != nil {
		field := "layout"
		if req.Layout == "" {
			field = "memory"
		}
		return in, lay, badRequest(field, "layout of memory file %s (%d bytes): %v", req.Memory, mem.Size(), err)
	}
	return in, lay, nil
}

// publishImport publishes a checked import under a fresh capture lease and
// returns the lease still held (the caller ends it or hands it to the
// recorder); on failure the lease is ended and the error carries its status.
func (d *Daemon) publishImport(ctx context.Context, req ImportRequest, in importFiles, lay layout.Layout) (repository.Lease, repository.Record, error) {
	lease, err := d.repo.BeginCapture(ctx)
	if err != nil {
		return nil, repository.Record{}, fmt.Errorf("import: %w", err)
	}
	rec, err := d.repo.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath: procPath(in.vmState), MemoryPath: procPath(in.memory), Layout: lay, Alias: req.Alias, Link: req.Link,
		RecordManifest: d.cfg.Snapshot.MemoryStartupPack.Enabled,
	})
	if err == nil {
		return lease, rec, nil
	}
	lease.End()
	err = in.namedAsSent(err, req)
	if d.reqCtx.Err() != nil {
		// Shutdown cut the copy short: the import may be sent again, to
		// this daemon once it is back or to another.
		return nil, repository.Record{}, statusError(http.StatusServiceUnavailable, "", fmt.Errorf("%w: import: %w", ErrShuttingDown, err))
	}
	if errors.Is(err, repository.ErrAliasConflict) {
		return nil, repository.Record{}, statusError(http.StatusConflict, "alias", err)
	}
	if errors.Is(err, repository.ErrInvalidRequest) {
		return nil, repository.Record{}, statusError(http.StatusBadRequest, "", err)
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
	var req VerifyRequest
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
	rep, err := snapcheck.Verify(r.Context(), d.repo, ref, snapcheck.Options{AddDigests: req.AddDigests, Cache: req.Cache == nil || *req.Cache})
	switch {
	case err != nil && d.reqCtx.Err() != nil:
		return statusError(http.StatusServiceUnavailable, "", fmt.Errorf("%w: %w", ErrShuttingDown, err))
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
	if err := d.checkOpen(); err != nil {
		return err
	}
	ctx := r.Context()
	ref := r.PathValue("id")
	rec, err := d.lookup(ctx, "id", ref)
	if err != nil {
		return err
	}
	lease, err := d.repo.LeaseExisting(ctx, rec.ID)
	if err != nil {
		return refError("id", ref, err)
	}
	defer lease.End()
	res, err := d.recorder.Record(ctx, lease)
	switch {
	case errors.Is(err, recorder.ErrDiscarded):
		return statusError(http.StatusNotFound, "id", err)
	case errors.Is(err, trust.ErrUntrusted):
		return statusError(http.StatusForbidden, "id", err)
	case err != nil && d.reqCtx.Err() != nil:
		return statusError(http.StatusServiceUnavailable, "", fmt.Errorf("%w: %w", ErrShuttingDown, err))
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
		return statusError(http.StatusServiceUnavailable, "", ErrShuttingDown)
	}
	return nil
}

func (d *Daemon) createRestore(w http.ResponseWriter, r *http.Request) error {
	var req RestoreRequest
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
	rec, err := d.lookup(ctx, "snapshot", req.Snapshot)
	if err != nil {
		return err
	}
	res, err := d.repo.Resolve(ctx, rec.ID)
	if err != nil {
		return refError("snapshot", req.Snapshot, err)
	}
	started := time.Now()
	inst, err := d.restorer.Restore(ctx, restore.SourceIn(ctx, d.repo, res), opts)
	if err != nil {
		return d.restoreFailed(err)
	}
	if testHookRestoreReady != nil {
		testHookRestoreReady(ctx)
	}
	run := &running{inst: inst, info: NewRestoreInfo(inst, rec.ID, opts, started)}
	if err := d.register(ctx, run); err != nil {
		return err
	}
	d.node.Learn(rec.ID, inst)
	d.log.Info("restore ready", "restore", inst.ID, "snapshot", rec.ID, "device", opts.Device, "generation", inst.Generation,
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
// snapshot cannot take (a device it cannot use, an io_engine other than
// the one its held device generation serves) is the client's to change,
// and names the field.
func (d *Daemon) restoreFailed(err error) error {
	var fe *restore.FieldError
	switch {
	case d.reqCtx.Err() != nil:
		return statusError(http.StatusServiceUnavailable, "", fmt.Errorf("%w: %w", ErrShuttingDown, err))
	case errors.As(err, &fe):
		return statusError(http.StatusBadRequest, fe.Field, err)
	case errors.Is(err, trust.ErrUntrusted):
		return statusError(http.StatusForbidden, "snapshot", err)
	case errors.Is(err, memdev.ErrConflict):
		return statusError(http.StatusConflict, "io_engine", err)
	}
	return err
}

// restoreOptions checks a restore request, fills what it leaves out from
// the configuration, and returns the restore's options; a bad field is a
// 400 naming it.
func (d *Daemon) restoreOptions(req *RestoreRequest) (restore.Options, error) {
	if err := checkRef("snapshot", req.Snapshot); err != nil {
		return restore.Options{}, err
	}
	opts, err := restore.OptionsFor(d.cfg, restore.Choice{Device: req.Device, Prefetch: req.Prefetch, Policy: req.Policy, IOEngine: req.IOEngine})
	if fe := (*restore.FieldError)(nil); errors.As(err, &fe) {
		return restore.Options{}, statusError(http.StatusBadRequest, fe.Field, fe.Err)
	}
	return opts, err
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
		return statusError(http.StatusServiceUnavailable, "", ErrShuttingDown)
	}
	d.countDevice(run)
	d.restores[run.info.ID] = run
	d.mu.Unlock()
	return nil
}

func (d *Daemon) listRestores(w http.ResponseWriter, _ *http.Request) error {
	d.mu.Lock()
	out := make([]RestoreInfo, 0, len(d.restores))
	for _, r := range d.restores {
		out = append(out, r.current())
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b RestoreInfo) int { return a.StartedAt.Compare(b.StartedAt) })
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
	writeJSON(w, http.StatusOK, StopResponse{ID: id, StopReport: rep})
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

// stopRestore stops a restore in the seed's order: stop the VM, wait for
// the prefetch reads, drop the restore's device reference.
func (d *Daemon) stopRestore(ctx context.Context, run *running) (restore.StopReport, error) {
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
