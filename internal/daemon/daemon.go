// Package daemon is `warmstart serve`: one long-lived process that owns the
// FUSE memory device, the shared prefetch engine and the restored VMs, and
// offers them over an HTTP API with JSON in and out, on a Unix socket
// ([daemon] socket) or a TCP address. Package api holds the bodies of its
// requests and answers and its Go client.
//
// # API
//
//	GET    /healthz                          liveness
//	GET    /metrics                          Prometheus metrics
//	GET    /snapshots[?alias_prefix=&has_manifest=]
//	GET    /snapshots/{id}                   id or alias; record and files
//	DELETE /snapshots/{id}
//	POST   /snapshots/import                 ImportRequest
//	POST   /snapshots/{id}/manifest:record   record the startup manifest now
//	POST   /snapshots/{id}/verify            [VerifyRequest] → snapcheck.Report
//	POST   /restores                         RestoreRequest → RestoreInfo
//	GET    /restores, /restores/{id}
//	DELETE /restores/{id}                    stop in the seed's order → StopResponse
//	POST   /restores/{id}/snapshot           PauseRequest → 201 PauseResult
//	GET    /openapi.json                     the OpenAPI 3 description of all of these
//
// Bad input is a 4xx whose body is an Error naming the field at fault: 400
// for a malformed id or alias, malformed JSON, an unknown field or an
// unknown device, mode or policy; 403 for a snapshot the daemon's trusted
// keys refuse (field snapshot, or id) and an import outside import_dirs;
// 404 for an unknown snapshot or restore; 409 for an alias held by
// another snapshot. A panic in a handler is
// logged and answered with a 500; it never takes the daemon down.
//
// A restore is in state running until its VM's process exits on its own
// (a crash, a kill, a guest shutdown); it is then listed in state exited
// with the exit status or signal, and keeps its device until DELETE, which
// releases it as for a running VM and answers 200 with that exit.
//
// With [manifest] record_after_publish, an import records the
// startup manifest in the background, holding the capture lease until the
// manifest is attached (or the recording is discarded).
//
// # Start and shutdown
//
// At start the runtime directory is made the daemon user's alone and the
// socket is created so that no other user can reach it at any instant
// (socket.go); a socket file left by a crashed daemon is removed, unless a
// daemon still answers on it (ErrAlreadyRunning); a dead FUSE mount left at
// [memory] fuse_mount is detached by fusedev.Mount; leftover per-restore
// directories are removed. Damaged catalog entries are logged, interrupted
// manifest recordings resumed (resume.go), and the VMM driver asked
// whether it can restore here (health.go).
//
// Shutdown (SIGTERM for Run) goes in this order, each step logged, each
// whatever became of the ones before it, within ShutdownBound:
//  1. stop accepting requests and let those in progress finish (after
//     ShutdownGrace they are cancelled and answered 503, and after
//     cancelledAnswerTime and abandonRequestsAfter left running);
//  2. stop every restore in the seed's order (restore.Instance.Stop: stop
//     the VM, wait for its prefetch reads, drop its device reference),
//     each with a fresh StopTimeout of its own, and end background
//     recordings (abandoned after abandonRecordingsAfter);
//  3. release the devices: the daemon holds its own reference to every
//     file device generation its restores use, drops it after the last of
//     them stopped, and waits for the acknowledgement that no read is in
//     flight (a fresh StopTimeout each);
//  4. close the node: the refinement (node.LearnerCloseBound), the
//     recorder's tracing mount and the device mount;
//  5. remove the socket.
//
// # Metrics
//
// GET /metrics serves the metrics package's Set: restore phases, prefetch
// tasks by outcome, readers in flight, device bytes by source, manifest
// validation failures, VMs that exited after ready and repository latency.
// Device bytes are read from the counters of the device generations the
// daemon holds (and, for uffd restores, of each session up to ready).
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/daemon/metrics"
	"warmstart/internal/logging"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/vmm"
)

// Defaults of the zero fields of Options.
const (
	// DefaultShutdownGrace is how long shutdown lets requests in progress
	// finish before it cancels them. Whatever clients, VMMs and the store
	// do, the shutdown then waits at most ShutdownBound(grace, stop
	// timeout) before it unmounts: 144 s with these defaults, a few
	// seconds when no VMM hangs (docs/daemon.md).
	DefaultShutdownGrace = 5 * time.Second
	DefaultStopTimeout   = time.Minute
	// DefaultResumeRetry: a recording whose holder crashed stays claimed
	// until its lease expires (an S3 lease after s3.LeaseTTL, 2 min), so
	// the resume looks again this often rather than only at start.
	DefaultResumeRetry = time.Minute
	// readHeaderTimeout bounds a client that opens a connection and sends
	// nothing.
	readHeaderTimeout = 10 * time.Second
	// readTimeout bounds reading a whole request, body included: a
	// client that trickles its body cannot hold a request open (bodies
	// are small JSON documents).
	readTimeout = 5 * time.Second
	// socketProbeTimeout bounds the check for a live daemon on the socket.
	socketProbeTimeout = time.Second
	// runDirName is the daemon's directory under [runtime] dir.
	runDirName = "daemon"
)

var (
	// ErrAlreadyRunning: a daemon answers on the configured socket.
	ErrAlreadyRunning = errors.New("a warmstart daemon is already running on the socket")
	// ErrShuttingDown is the error of requests refused during shutdown.
	ErrShuttingDown = errors.New("the daemon is shutting down")
)

// Options configure a Daemon.
type Options struct {
	// Config is the loaded configuration; required.
	Config *config.Config
	// Repository keeps the snapshots; required. The daemon times every
	// operation on it.
	Repository repository.Repository
	// VMM restores snapshots; required (node.NewVMM builds the configured one).
	VMM vmm.VMM
	// Log receives the daemon's log; nil discards it.
	Log *slog.Logger
	// Listen is a TCP address (host:port) to serve instead of the Unix
	// socket; empty takes [daemon] listen, and if that is empty too the
	// API is served on [daemon] socket.
	Listen string
	// FUSE configures the file device mount (tests hold reads in its
	// ReadHook). AllowWriteOpen is turned on for the QEMU driver, on this
	// mount and on the recorder's tracing mount.
	FUSE fusedev.Options
	// ShutdownGrace is how long shutdown lets requests in progress finish
	// before cancelling them.
	ShutdownGrace time.Duration
	// StopTimeout bounds the stop of one restore.
	StopTimeout time.Duration
	// ResumeRetry is how often the resume of interrupted recordings looks
	// again at snapshots another holder had claimed; zero means
	// DefaultResumeRetry.
	ResumeRetry time.Duration
}

// Daemon is a running warmstart daemon.
type Daemon struct {
	cfg        *config.Config
	log        *slog.Logger
	repo       repository.Repository
	fuse       *fusedev.Server
	node       *node.Node // the parts below, assembled once
	engine     *prefetch.Engine
	recorder   *recorder.Recorder
	metrics    *metrics.Set
	requests   *inflight
	grace      time.Duration
	stopWithin time.Duration

	ln         net.Listener
	socketPath string      // "" when serving TCP
	socketInfo os.FileInfo // the socket file this daemon created
	srv        *http.Server

	// reqCtx is the base of every request's context; cancelling it aborts
	// requests still running when the shutdown grace ends.
	reqCtx    context.Context
	reqCancel context.CancelFunc
	// recCtx bounds background recordings.
	recCtx    context.Context
	recCancel context.CancelFunc
	// retryEvery is Options.ResumeRetry.
	retryEvery time.Duration

	mu         sync.Mutex
	closing    bool
	restores   map[string]*running
	recordings map[*recorder.Job]string

	// devMu guards devices; it orders the daemon's attaches and releases.
	devMu         sync.Mutex
	devices       map[memdev.ID]memdev.Device // the daemon's references to shared device generations
	releasedBytes atomic.Uint64               // read by released generations
	uffdBytes     atomic.Uint64               // read by uffd sessions up to ready

	// token is the bearer token TCP requests must carry; "" on the socket.
	token string
	// instance is the runtime directory's lock, held until shutdown ends.
	instance *instanceLock
	// degraded is why the VMM cannot restore here, "" when it can.
	degraded string

	shutdownOnce sync.Once
	shutdownErr  error
}

// New prepares a daemon: it checks the socket, mounts the FUSE device and
// listens. Serve then answers requests; Shutdown undoes it all.
func New(opts Options) (_ *Daemon, err error) {
	if opts.Config == nil || opts.Repository == nil || opts.VMM == nil {
		return nil, errors.New("daemon: Config, Repository and VMM are required")
	}
	d := newDaemon(opts)
	// Before anything else: a runtime directory no other user can enter,
	// and one daemon per runtime directory.
	if err := privateRuntimeDir(d.cfg.Runtime.Dir, d.log); err != nil {
		return nil, err
	}
	if d.instance, err = lockRuntimeDir(d.cfg.Runtime.Dir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.instance.release()
		}
	}()
	listen := cmp.Or(opts.Listen, d.cfg.Daemon.Listen)
	if err := d.claimAddress(listen); err != nil {
		return nil, err
	}
	d.degraded = vmmHealth(opts.VMM, d.cfg, d.log)
	if err := d.openNode(opts); err != nil {
		return nil, err
	}
	d.reqCtx, d.reqCancel = context.WithCancel(context.Background())
	d.recCtx, d.recCancel = context.WithCancel(context.Background())
	d.reportDamage(d.recCtx)
	d.resumeRecordings(d.recCtx)
	if err := d.listen(listen); err != nil {
		d.reqCancel()
		d.recCancel()
		d.node.Close()
		return nil, err
	}
	d.log.Info("daemon ready", "address", d.Address(), "fuse_mount", d.fuse.Dir(),
		"prefetch_on_restore", d.cfg.Prefetch.OnRestore, "record_after_publish", d.cfg.Manifest.RecordAfterPublish)
	return d, nil
}

// newDaemon is a daemon with opts' settings and its defaults, before it
// has touched anything.
func newDaemon(opts Options) *Daemon {
	d := &Daemon{
		cfg:        opts.Config,
		log:        opts.Log,
		requests:   newInflight(),
		grace:      cmp.Or(opts.ShutdownGrace, DefaultShutdownGrace),
		stopWithin: cmp.Or(opts.StopTimeout, DefaultStopTimeout),
		retryEvery: cmp.Or(opts.ResumeRetry, DefaultResumeRetry),
		restores:   map[string]*running{},
		recordings: map[*recorder.Job]string{},
		devices:    map[memdev.ID]memdev.Device{},
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.grace < 0 {
		d.grace = DefaultShutdownGrace
	}
	if d.stopWithin < 0 {
		d.stopWithin = DefaultStopTimeout
	}
	return d
}

// claimAddress prepares to serve listen, or the Unix socket when it is
// empty: a stale socket is removed (a live daemon's never), a TCP
// address gets its bearer token.
func (d *Daemon) claimAddress(listen string) error {
	if listen != "" {
		return d.loadToken(listen)
	}
	d.socketPath = d.cfg.Daemon.Socket
	return d.removeStaleSocket()
}

// openNode cleans the daemon's runtime directory and assembles its node:
// the serving restorer reports to the metrics, the recorder's tracing
// restorer never does (recording restores are throwaway and would only
// blur the restore metrics).
func (d *Daemon) openNode(opts Options) error {
	runDir := filepath.Join(d.cfg.Runtime.Dir, runDirName)
	// Restore directories of a crashed run hold only dead sockets and logs.
	if err := os.RemoveAll(filepath.Join(runDir, "restores")); err != nil {
		return fmt.Errorf("daemon: clean runtime directory: %w", err)
	}
	// So do the directories of CLI verbs killed on this node, with their
	// dead FUSE mounts, which only the next in-process verb would sweep
	// otherwise: on a node that talks to its daemon alone, never.
	node.SweepDeadCLIDirs(d.cfg.Runtime.Dir, d.log)
	sweepPauseStaging(d.cfg.Runtime.Dir, d.log)
	n, err := node.Open(context.Background(), node.Options{
		Config:     d.cfg,
		Repository: opts.Repository,
		VMM:        opts.VMM,
		RuntimeDir: runDir,
		FUSEMount:  d.cfg.Memory.FUSEMount,
		FUSE:       opts.FUSE,
		Log:        d.log,
		Metrics: func(e *prefetch.Engine) node.Metrics {
			d.metrics = metrics.New(e, d.activeRestores, d.deviceBytes)
			return d.metrics
		},
	})
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.node = n
	d.repo, d.fuse, d.engine = n.Repo, n.FUSE, n.Engine
	d.recorder = n.Recorder
	return nil
}

// listen opens the listener and the HTTP server on it.
func (d *Daemon) listen(listen string) error {
	var err error
	if d.socketPath != "" {
		err = d.listenUnix()
	} else {
		d.ln, err = net.Listen("tcp", listen)
	}
	if err != nil {
		return fmt.Errorf("daemon: listen: %w", err)
	}
	d.srv = &http.Server{
		Handler:           d.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		BaseContext:       func(net.Listener) context.Context { return d.reqCtx },
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	return nil
}

// removeStaleSocket removes a socket file no daemon answers on, and refuses
// to touch a live one or a file that is not a socket.
func (d *Daemon) removeStaleSocket() error {
	fi, err := os.Lstat(d.socketPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("daemon: socket %s: %w", d.socketPath, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("daemon: %s exists and is not a socket; not removing it", d.socketPath)
	}
	conn, err := net.DialTimeout("unix", d.socketPath, socketProbeTimeout)
	if err == nil {
		conn.Close()
		return fmt.Errorf("daemon: %s: %w", d.socketPath, ErrAlreadyRunning)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("daemon: probe socket %s: %w", d.socketPath, err)
	}
	if err := os.Remove(d.socketPath); err != nil {
		return fmt.Errorf("daemon: remove stale socket: %w", err)
	}
	d.log.Info("removed stale socket of an earlier daemon", "socket", d.socketPath)
	return nil
}

// listenUnix listens on the API socket: private from its creation, in a
// directory no other user can replace it in, answering only the daemon's
// user and root (socket.go).
func (d *Daemon) listenUnix() error {
	if err := checkSocketDir(filepath.Dir(d.socketPath)); err != nil {
		return err
	}
	ln, fi, err := listenPrivate(d.socketPath)
	if err != nil {
		return err
	}
	d.ln, d.socketInfo = newOwnerOnly(ln, os.Geteuid(), d.log), fi
	return nil
}

// Address is where the API is served: the socket path or host:port.
func (d *Daemon) Address() string {
	if d.socketPath != "" {
		return d.socketPath
	}
	return d.ln.Addr().String()
}

// Endpoint is Address in the form NewClient takes.
func (d *Daemon) Endpoint() string {
	if d.socketPath != "" {
		return d.socketPath
	}
	return "http://" + d.ln.Addr().String()
}

// Handler is the API, middleware included.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", d.serve(d.healthz))
	mux.Handle("GET /metrics", d.metrics.Handler(slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)))
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	mux.Handle("GET /snapshots", d.serve(d.listSnapshots))
	mux.Handle("POST /snapshots/import", d.serve(d.importSnapshot))
	mux.Handle("GET /snapshots/{id}", d.serve(d.getSnapshot))
	mux.Handle("DELETE /snapshots/{id}", d.serve(d.deleteSnapshot))
	// The action segment is matched as a wildcard: the mux unescapes it, so
	// "manifest%3Arecord" arrives as "manifest:record" too.
	mux.Handle("POST /snapshots/{id}/{action}", d.serve(d.snapshotAction))
	// More specific than the wildcard above, so it wins.
	mux.Handle("POST /snapshots/{id}/verify", d.serve(d.verifySnapshot))
	mux.Handle("POST /restores", d.serve(d.createRestore))
	mux.Handle("GET /restores", d.serve(d.listRestores))
	mux.Handle("GET /restores/{id}", d.serve(d.getRestore))
	mux.Handle("DELETE /restores/{id}", d.serve(d.deleteRestore))
	mux.Handle("POST /restores/{id}/snapshot", d.serve(d.pauseRestore))
	var h http.Handler = routed(mux)
	if d.token != "" {
		h = requireToken(d.token, h)
	}
	return recovered(d.log, d.requests.wrap(logged(d.log, h)))
}

// loadToken reads or creates the bearer token TCP clients must send.
func (d *Daemon) loadToken(listen string) error {
	token, path, created, err := serveToken(d.cfg, listen)
	if err != nil {
		return err
	}
	d.token = token
	if created {
		d.log.Info("created the API token; TCP clients send it as Authorization: Bearer", "token_file", path)
	} else {
		d.log.Info("TCP clients must send the API token", "token_file", path)
	}
	return nil
}

// Bounds of the shutdown steps that wait for work they cancelled: each
// waits this long and then goes on without it (a request's handler, a
// pause's clean-up or a background recording held up by a store that does
// not answer; the process exit ends them).
const (
	// cancelledAnswerTime is how long cancelled requests get to answer
	// before their connections are closed.
	cancelledAnswerTime = time.Second
	// abandonRequestsAfter is how long, after that, shutdown waits for
	// their handlers to return.
	abandonRequestsAfter = 2 * time.Second
	// shutdownPauseWait is how long the stop of a restore waits, in a
	// shutdown, for its pause (cancelled at the grace) to return before
	// it stops the VM under it.
	shutdownPauseWait = 2 * time.Second
	// abandonRecordingsAfter is how long shutdown waits for the
	// background recordings it cancelled.
	abandonRecordingsAfter = 2 * time.Second
)

// ShutdownBound is the longest a shutdown of a daemon with grace
// (ShutdownGrace) and stopTimeout (StopTimeout) waits, whatever clients,
// VMMs and the store do, before it unmounts FUSE: the grace, the
// cancelled requests' answer and abandon times, a pause's, each restore's
// stop and then its device release (restores stop side by side, each
// with its own stopTimeout), the recordings' and the refinement's bounds.
func ShutdownBound(grace, stopTimeout time.Duration) time.Duration {
	return grace + cancelledAnswerTime + abandonRequestsAfter + shutdownPauseWait + 2*stopTimeout +
		abandonRecordingsAfter + node.LearnerCloseBound
}

// awaitCancelled waits for the cancelled requests to return. Those that do
// not within cancelledAnswerTime are blocked where a context does not
// reach (reading a body the client trickles): closing the connections
// ends them. Handlers that still do not return within
// abandonRequestsAfter are left running.
func (d *Daemon) awaitCancelled(idle <-chan struct{}) {
	t := time.NewTimer(cancelledAnswerTime)
	defer t.Stop()
	select {
	case <-idle:
		return
	case <-t.C:
		d.srv.Close()
	}
	t.Reset(abandonRequestsAfter)
	select {
	case <-idle:
	case <-t.C:
		d.log.Warn("shutdown: requests still running abandoned", "waited", cancelledAnswerTime+abandonRequestsAfter)
	}
}

// Serve answers requests until Shutdown; it then returns nil.
func (d *Daemon) Serve() error {
	if err := d.srv.Serve(d.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("daemon: serve: %w", err)
	}
	return nil
}

// Serve runs the daemon of `warmstart serve` until ctx is done: on repo,
// with the VMM cfg names, logging on logOut, serving listen (see
// Options.Listen).
func Serve(ctx context.Context, cfg *config.Config, repo repository.Repository, listen string, logOut io.Writer) error {
	// What needs nothing probed is refused first: building the VMM may
	// take half a minute (QEMU's accelerator probe under TCG).
	if addr := cmp.Or(listen, cfg.Daemon.Listen); addr != "" && cfg.Daemon.TokenFile == "" && !isLoopback(addr) {
		return fmt.Errorf("daemon: listen %s: %w", addr, ErrNoToken)
	}
	log, err := logging.New(logOut, cfg.Log)
	if err != nil {
		return err
	}
	probes := probesKVM(cfg)
	if probes {
		log.Info("probing whether KVM runs the guest (up to 30 s; the verdict is kept under [runtime] dir)")
	}
	started := time.Now()
	vm, err := node.NewVMM(ctx, cfg)
	if err == nil && probes {
		log.Info("VMM ready", "took", time.Since(started).Round(time.Millisecond).String())
	}
	if err != nil {
		if ctx.Err() != nil {
			// A signal while the VMM was being built: a shutdown with
			// nothing yet to undo, not a VMM that failed.
			log.Info("shutdown before the daemon was ready", "cause", context.Cause(ctx).Error())
			return nil
		}
		return err
	}
	return Run(ctx, Options{Config: cfg, Repository: repo, VMM: vm, Log: log, Listen: listen})
}

// probesKVM reports whether building cfg's VMM may boot a guest to learn
// whether KVM runs it (up to half a minute under TCG): the auto driver,
// or QEMU with accel auto.
func probesKVM(cfg *config.Config) bool {
	return cfg.VMM.Driver == config.DriverAuto ||
		(cfg.VMM.Driver == config.DriverQEMU && cfg.QEMU.Accel == config.AccelAuto)
}

// Run serves until ctx is done (cmd/warmstart cancels it on SIGTERM and
// SIGINT), then shuts down in order.
func Run(ctx context.Context, opts Options) error {
	d, err := New(opts)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve() }()
	var serveErr error
	select {
	case <-ctx.Done():
		d.log.Info("shutdown begun", "cause", context.Cause(ctx).Error())
	case serveErr = <-served:
		d.log.Error("serving stopped; shutting down", "err", serveErr)
	}
	// Every step bounds itself (ShutdownBound).
	return errors.Join(serveErr, d.Shutdown(context.Background()))
}

// Shutdown stops the daemon in the order of the package doc. ctx can cut
// the grace short; every later step bounds its own waits (ShutdownBound),
// so each runs whatever became of the ones before it. It is safe to call
// more than once; later calls return the first call's result.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdownOnce.Do(func() { d.shutdownErr = d.shutdown(ctx) })
	return d.shutdownErr
}

func (d *Daemon) shutdown(ctx context.Context) error {
	var errs errorList
	errs.add(d.stopServing(ctx))                   // 1.
	stopping := d.stopRestoresAndRecordings(&errs) // 2.
	d.releaseDevices(stopping, &errs)              // 3.
	d.closeNode(&errs)                             // 4.
	d.reqCancel()
	errs.add(d.removeSocket()) // 5.
	d.instance.release()
	if err := errs.join(); err != nil {
		d.log.Error("shutdown complete with errors", "err", err)
		return fmt.Errorf("daemon shutdown: %w", err)
	}
	d.log.Info("shutdown complete")
	return nil
}

// errorList collects the errors of steps that run concurrently.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) add(err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorList) join() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.errs...)
}

// stopServing is shutdown step 1: stop accepting requests and let those in
// progress finish within the grace, then cancel what is left and wait for
// it to return.
func (d *Daemon) stopServing(ctx context.Context) error {
	var errs []error
	gctx, cancel := context.WithTimeout(ctx, d.grace)
	if err := d.srv.Shutdown(gctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		errs = append(errs, fmt.Errorf("close listener: %w", err))
	}
	cancel()
	d.ln.Close() // in case Serve never ran
	idle, cancelled := d.requests.close()
	if cancelled > 0 {
		d.reqCancel()
		d.log.Warn("shutdown: grace over; requests still running cancelled", "requests", cancelled)
		d.awaitCancelled(idle)
	}
	d.log.Info("shutdown: no longer accepting requests", "cancelled", cancelled)
	return errors.Join(errs...)
}

// stopRestoresAndRecordings is shutdown step 2: stop every restore, each
// in the seed's order and with a stop timeout of its own, side by side,
// and end the background recordings (waiting abandonRecordingsAfter for
// them). It returns the restores it stopped.
func (d *Daemon) stopRestoresAndRecordings(errs *errorList) []*running {
	d.mu.Lock()
	d.closing = true
	stopping := make([]*running, 0, len(d.restores))
	for id, r := range d.restores {
		stopping = append(stopping, r)
		delete(d.restores, id)
	}
	jobs := maps.Clone(d.recordings)
	d.mu.Unlock()
	d.recCancel()
	var wg sync.WaitGroup
	for _, r := range stopping {
		wg.Go(func() {
			_, err := d.stopRestore(context.Background(), r)
			errs.add(err)
		})
	}
	wg.Wait()
	wait, cancel := context.WithTimeout(context.Background(), abandonRecordingsAfter)
	defer cancel()
	for j, id := range jobs {
		select {
		case <-j.Done():
		case <-wait.Done():
			d.log.Warn("shutdown: recording still running abandoned", "snapshot", id)
		}
	}
	d.log.Info("shutdown: restores stopped", "restores", len(stopping), "recordings", len(jobs))
	return stopping
}

// releaseDevices is shutdown step 3: release the devices the stopped
// restores ran on, each within a stop timeout of its own; the daemon's
// references are the last ones.
func (d *Daemon) releaseDevices(stopped []*running, errs *errorList) {
	devices := d.heldDevices()
	var wg sync.WaitGroup
	for _, r := range stopped {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), d.stopWithin)
			defer cancel()
			_, err := d.releaseDevice(ctx, deviceOf(r))
			errs.add(err)
		})
	}
	wg.Wait()
	d.log.Info("shutdown: devices released", "generations", devices)
}

// closeNode is shutdown step 4: close the node's parts (the refinement,
// the tracing mount, the FUSE mount), each whatever became of the others,
// logging each, and which failed and why.
func (d *Daemon) closeNode(errs *errorList) {
	d.node.CloseEach(func(step string, err error) {
		if err != nil {
			d.log.Error("shutdown: close failed", "step", step, "err", err)
			errs.add(fmt.Errorf("close %s: %w", step, err))
			return
		}
		if step == node.StepServingMount {
			d.log.Info("shutdown: FUSE unmounted", "dir", d.fuse.Dir())
			return
		}
		d.log.Info("shutdown: closed", "step", step)
	})
}

// removeSocket is shutdown step 5: remove the socket, if it is still the
// one this daemon made.
func (d *Daemon) removeSocket() error {
	if d.socketPath == "" {
		return nil
	}
	fi, err := os.Lstat(d.socketPath)
	if err != nil || !os.SameFile(fi, d.socketInfo) {
		return nil
	}
	if err := os.Remove(d.socketPath); err != nil {
		return fmt.Errorf("remove socket: %w", err)
	}
	d.log.Info("shutdown: socket removed", "socket", d.socketPath)
	return nil
}

func (d *Daemon) activeRestores() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.restores)
}
