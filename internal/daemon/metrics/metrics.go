// Package metrics is the daemon's Prometheus instrumentation: restore
// phase histograms, prefetch tasks by outcome, readers in flight, device
// bytes by source, manifest validation failures by reason, VMs that exited
// after ready, and repository operation latency, on a registry of their
// own. A Set is the restore.Observer of the daemon's restores and wraps its
// repository.
package metrics

import (
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// Metric names, each documented by its Help text.
const (
	metricPhaseSeconds      = "warmstart_restore_phase_seconds"
	metricReadySeconds      = "warmstart_restore_ready_seconds"
	metricRestoresActive    = "warmstart_restores_active"
	metricRestorePrefetch   = "warmstart_restore_prefetch_outcomes_total"
	metricTasksStarted      = "warmstart_prefetch_tasks_started_total"
	metricTasks             = "warmstart_prefetch_tasks_total"
	metricReadersInFlight   = "warmstart_prefetch_readers_in_flight"
	metricDeviceBytes       = "warmstart_device_read_bytes_total"
	metricManifestRejected  = "warmstart_manifest_validation_failures_total"
	metricVMExits           = "warmstart_restore_vm_exits_total"
	metricRepositorySeconds = "warmstart_repository_operation_seconds"
	metricIntegrity         = "warmstart_integrity_failures_total"
)

// Lowest histogram buckets; each next bucket doubles (phases) or
// quadruples (repository operations), up to tens of seconds.
const (
	phaseBucketStartSeconds      = 0.0005
	repositoryBucketStartSeconds = 0.0001
)

// Restore phases, as the phase label names them.
const (
	phaseDeviceAcquire    = "device_acquire"
	phaseManifestValidate = "manifest_validate"
	phaseVMStart          = "vm_start"
	phaseReady            = "ready"
)

// How a VM that exited after ready ended, as the how label of
// metricVMExits names it: a fixed set, whatever the signal or status.
const (
	exitSignal = "signal" // killed by a signal (a crash, SIGKILL, the OOM killer)
	exitError  = "error"  // a non-zero exit status
	exitClean  = "clean"  // exit status 0 (the guest shut down)
)

// Set is the daemon's collectors, on a registry of their own so that
// /metrics shows exactly what the daemon measures (plus the standard Go and
// process collectors). It is the restore.Observer of the daemon's restores.
type Set struct {
	reg *prometheus.Registry

	phases           *prometheus.HistogramVec
	startup          *startupMetrics
	restorePrefetch  *prometheus.CounterVec
	manifestRejected *prometheus.CounterVec
	integrity        *prometheus.CounterVec
	vmExits          *prometheus.CounterVec
	repository       *prometheus.HistogramVec
	tasks            *taskCollector
	deviceBytes      *deviceBytesCollector
}

var (
	_ restore.Observer     = (*Set)(nil)
	_ restore.ExitObserver = (*Set)(nil)
)

// New registers every collector. engine feeds the prefetch task, reader and
// byte figures; active counts the running restores and deviceBytes totals
// what their memory devices have read from lower files (see the
// device-bytes collector for how that is split by source).
func New(engine *prefetch.Engine, active func() int, deviceBytes func() uint64) *Set {
	m := &Set{
		reg: prometheus.NewRegistry(),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricPhaseSeconds,
			Help: "Duration of each restore phase: device_acquire (call to memory device attached), manifest_validate " +
				"(startup manifest read and checked), vm_start (VMM started loading the snapshot), ready (until the guest agent answered).",
			Buckets: prometheus.ExponentialBuckets(phaseBucketStartSeconds, 2, 17),
		}, []string{"phase"}),
		restorePrefetch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricRestorePrefetch,
			Help: "Restores that joined a prefetch task, by the task's state when the restore stopped.",
		}, []string{"state"}),
		manifestRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricManifestRejected,
			Help: "Startup manifests that failed validation on restore, by reason: a refined one falls back to the recorded one, " +
				"a recorded one to on-demand reads.",
		}, []string{"reason"}),
		integrity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricIntegrity,
			Help: "Snapshot bytes that failed their integrity check on restore and were not served, by artifact: " +
				"memory (a block that does not match the digest table; counted once per block and device generation), " +
				"vm_state (not the recorded SHA-256) and digests (a digest table that does not match the record).",
		}, []string{"artifact"}),
		vmExits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricVMExits,
			Help: "VMs whose process exited after ready without being stopped, by how: signal (killed by a signal), " +
				"error (non-zero exit status) or clean (exit status 0, e.g. the guest shut down).",
		}, []string{"how"}),
		repository: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricRepositorySeconds,
			Help:    "Latency of snapshot repository operations, by operation and outcome (ok, not_found, error).",
			Buckets: prometheus.ExponentialBuckets(repositoryBucketStartSeconds, 4, 10),
		}, []string{"operation", "outcome"}),
		tasks:       &taskCollector{engine: engine, skipped: map[string]uint64{}},
		deviceBytes: &deviceBytesCollector{engine: engine, device: deviceBytes},
	}
	// Pre-create the label values a dashboard expects, so they read 0
	// rather than being absent before the first event.
	for _, p := range []string{phaseDeviceAcquire, phaseManifestValidate, phaseVMStart, phaseReady} {
		m.phases.WithLabelValues(p)
	}
	for _, a := range []string{restore.ArtifactMemory, restore.ArtifactVMState, restore.ArtifactDigests} {
		m.integrity.WithLabelValues(a)
	}
	for _, how := range []string{exitSignal, exitError, exitClean} {
		m.vmExits.WithLabelValues(how)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.phases, m.restorePrefetch, m.manifestRejected, m.integrity, m.vmExits, m.repository, m.tasks, m.deviceBytes,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: metricTasksStarted,
			Help: "Prefetch tasks started. Restores that share a task (same device generation and manifest) start one.",
		}, func() float64 { return float64(engine.Stats().TasksStarted) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: metricReadersInFlight,
			Help: "Prefetch reads in progress now, across all tasks (bounded by [prefetch] max_readers).",
		}, func() float64 { return float64(engine.Stats().ReadersInFlight) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: metricRestoresActive,
			Help: "Restores the daemon holds: ready and not yet stopped.",
		}, func() float64 { return float64(active()) }),
	)
	m.startup = newStartupMetrics(m.reg)
	return m
}

// ManifestRejected implements restore.Observer.
func (m *Set) ManifestRejected(reason string) {
	m.manifestRejected.WithLabelValues(reason).Inc()
}

// IntegrityFailure implements restore.IntegrityObserver.
func (m *Set) IntegrityFailure(artifact string) {
	m.integrity.WithLabelValues(artifact).Inc()
}

var _ restore.IntegrityObserver = (*Set)(nil)

// PrefetchSkipped implements restore.Observer.
func (m *Set) PrefetchSkipped(reason string) { m.tasks.skip(skipReason(reason)) }

// PrefetchEnded implements restore.Observer.
func (m *Set) PrefetchEnded(state prefetch.State) {
	m.restorePrefetch.WithLabelValues(state.String()).Inc()
}

// VMExited implements restore.ExitObserver.
func (m *Set) VMExited(st vmm.ProcessExit) {
	how := exitClean
	switch {
	case st.Signaled():
		how = exitSignal
	case st.Code != 0:
		how = exitError
	}
	m.vmExits.WithLabelValues(how).Inc()
}

// Phases implements restore.Observer. Timings are cumulative from the
// restore call; each phase is the difference to the previous mark.
func (m *Set) Phases(t restore.Timings) {
	prev := int64(0)
	for _, p := range []struct {
		name string
		at   int64
	}{
		{phaseDeviceAcquire, int64(t.DeviceAcquired)},
		{phaseManifestValidate, int64(t.ManifestValidated)},
		{phaseVMStart, int64(t.VMStarted)},
		{phaseReady, int64(t.Ready)},
	} {
		// The guest's ready time comes from the VMM's own clock and may
		// precede the moment its start call returned.
		m.phases.WithLabelValues(p.name).Observe(float64(max(p.at-prev, 0)) / 1e9)
		prev = max(prev, p.at)
	}
}

// skipReason maps restore's skip messages to a small label set; a message
// carrying an error text would make a new series per error.
func skipReason(reason string) string {
	switch {
	case reason == "prefetch off":
		return "mode_off"
	case reason == "prefetch.on_restore is off":
		return "consume_disabled"
	case reason == "snapshot has no startup manifest":
		return "no_manifest"
	case strings.HasPrefix(reason, "io_engine 2"):
		return "direct_io"
	case strings.HasPrefix(reason, "manifest rejected"):
		return "manifest_rejected"
	}
	return "other"
}

// taskCollector reports prefetch tasks by outcome: completed, cancelled
// and failed come from the engine, which counts each shared task once;
// skipped (with a reason) counts restores that started no task.
type taskCollector struct {
	engine *prefetch.Engine

	mu      sync.Mutex
	skipped map[string]uint64
}

var taskDesc = prometheus.NewDesc(metricTasks,
	"Prefetch tasks by outcome (completed, cancelled, failed), and restores that skipped prefetch (outcome skipped, with the reason).",
	[]string{"outcome", "reason"}, nil)

func (c *taskCollector) skip(reason string) {
	c.mu.Lock()
	c.skipped[reason]++
	c.mu.Unlock()
}

func (c *taskCollector) Describe(ch chan<- *prometheus.Desc) { ch <- taskDesc }

func (c *taskCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.engine.Stats()
	for _, o := range []struct {
		outcome string
		n       uint64
	}{{"completed", s.TasksCompleted}, {"cancelled", s.TasksCancelled}, {"failed", s.TasksFailed}} {
		ch <- prometheus.MustNewConstMetric(taskDesc, prometheus.CounterValue, float64(o.n), o.outcome, "")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for reason, n := range c.skipped {
		ch <- prometheus.MustNewConstMetric(taskDesc, prometheus.CounterValue, float64(n), "skipped", reason)
	}
}

// deviceBytesCollector reports bytes the memory devices read from lower
// files, by source.
//
// The devices count bytes, not who asked for them, so the split is
// derived: prefetch is the engine's BytesFetched (bytes prefetch brought
// in: fills and reads through a file device, installs into a uffd VM),
// fault is every other byte (device bytes minus prefetch bytes). Device
// bytes are the counters of every file device generation the daemon's
// restores used (held by the daemon until the last of them stops) plus
// each uffd restore's session up to ready. Prefetch of a page already
// cached (a racing fault brought it in) still counts as prefetch, and uffd
// faults after ready are not seen, so fault bytes are a lower bound; they
// are held monotonic, as a counter must be.
type deviceBytesCollector struct {
	engine *prefetch.Engine
	device func() uint64

	mu        sync.Mutex
	faultHigh uint64
}

var deviceBytesDesc = prometheus.NewDesc(metricDeviceBytes,
	"Bytes the memory devices read from snapshot memory files, by source: prefetch, or fault (everything else: the VMM's "+
		"page faults and their readahead). Derived as fault = device bytes - prefetch bytes, held monotonic.",
	[]string{"source"}, nil)

func (c *deviceBytesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- deviceBytesDesc }

func (c *deviceBytesCollector) Collect(ch chan<- prometheus.Metric) {
	pre := c.engine.Stats().BytesFetched
	dev := c.device()
	c.mu.Lock()
	if dev > pre {
		c.faultHigh = max(c.faultHigh, dev-pre)
	}
	fault := c.faultHigh
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(deviceBytesDesc, prometheus.CounterValue, float64(pre), "prefetch")
	ch <- prometheus.MustNewConstMetric(deviceBytesDesc, prometheus.CounterValue, float64(fault), "fault")
}

// Registry is where every collector of the set is registered.
func (m *Set) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Set) Handler(errorLog promhttp.Logger) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: errorLog})
}

// Repository returns repo with the latency of every operation observed.
// What callers find on a repository by type assertion stays found on the
// wrapper: repository.SweptAliases, Root when the backend has one
// (posixfs), and anything else through Unwrap.
func (m *Set) Repository(repo repository.Repository) repository.Repository {
	m.startup.observeCacheOf(repo)
	timed := &timedRepository{inner: repo, seconds: m.repository}
	if rooted, ok := repo.(interface{ Root() string }); ok {
		return rootedRepository{timedRepository: timed, rooted: rooted}
	}
	return timed
}
