package metrics

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"warmstart/internal/chunkcache"
	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// Metric names of the startup-set accounting, the node cache and the build.
const (
	metricStartupPages      = "warmstart_startup_set_pages_total"
	metricDemandFaultSecs   = "warmstart_demand_fault_seconds"
	metricCacheLookups      = "warmstart_chunk_cache_lookups_total"
	metricCacheFetchedBytes = "warmstart_chunk_cache_fetched_bytes_total"
	metricCacheEvictions    = "warmstart_chunk_cache_evictions_total"
	metricCacheGetSeconds   = "warmstart_chunk_cache_get_seconds"
	metricBuildInfo         = "warmstart_build_info"
)

// Startup-set outcomes, as the outcome label names them.
var startupOutcomes = []string{"in_time", "late", "unused", "missed"}

// faultBucketStartSeconds is the lowest demand-fault latency bucket (a
// page-cache hit through FUSE takes tens of microseconds); each next one
// doubles, up to about a second.
const faultBucketStartSeconds = 0.00001

// startupMetrics are the per-restore outcome metrics (RestoreReady) and
// the node cache's, every labelled series created at start.
type startupMetrics struct {
	ready       *prometheus.HistogramVec
	pages       *prometheus.CounterVec
	demandFault *prometheus.HistogramVec
	cacheGet    prometheus.Histogram
	// cache is the S3 repository's chunk cache, once the daemon's
	// repository is known; nil on a POSIX repository (its series read 0).
	cache atomic.Pointer[chunkcache.Cache]
}

func newStartupMetrics(reg *prometheus.Registry) *startupMetrics {
	m := &startupMetrics{
		ready: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricReadySeconds,
			Help: "Time from the restore call to the guest agent answering (the seed's time to ready), by memory device, " +
				"prefetch (on: joined a task; off: --prefetch off; skipped: any other reason) and policy.",
			Buckets: prometheus.ExponentialBuckets(phaseBucketStartSeconds, 2, 17),
		}, []string{"device", "prefetch", "policy"}),
		pages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricStartupPages,
			Help: "Pages (4 KiB) of restores' startup sets by outcome at ready: in_time, late, unused; and missed " +
				"(requested on demand, not in the startup set). See the README for what each device can see.",
		}, []string{"outcome"}),
		demandFault: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricDemandFaultSecs,
			Help: "Latency of serving one demand request until ready, by memory device: a uffd page fault, or a FUSE " +
				"read request of the VMM (fault plus readaround).",
			Buckets: prometheus.ExponentialBuckets(faultBucketStartSeconds, 2, 17),
		}, []string{"device"}),
		cacheGet: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metricCacheGetSeconds,
			Help:    "Latency of the S3 node cache's ranged GETs (demand and prefetch) to the response.",
			Buckets: prometheus.ExponentialBuckets(repositoryBucketStartSeconds, 4, 10),
		}),
	}
	for _, device := range []string{config.DeviceFile, config.DeviceUffd} {
		m.demandFault.WithLabelValues(device)
		for _, pf := range []string{restore.PrefetchLabelOn, restore.PrefetchLabelOff, restore.PrefetchLabelSkipped} {
			for _, policy := range restore.PolicyNames() {
				m.ready.WithLabelValues(device, pf, policy)
			}
		}
	}
	for _, o := range startupOutcomes {
		m.pages.WithLabelValues(o)
	}
	reg.MustRegister(m.ready, m.pages, m.demandFault, m.cacheGet, m.cacheCollector(), buildInfo())
	return m
}

// RestoreReady implements restore.ReadyObserver.
func (m *Set) RestoreReady(o restore.ReadyOutcome) {
	s := m.startup
	s.ready.WithLabelValues(o.Device, o.Prefetch, o.Policy).Observe(o.Timings.Ready.Seconds())
	r := o.StartupSet
	for i, n := range []int64{r.InTimePages, r.LatePages, r.UnusedPages, r.MissedPages} {
		s.pages.WithLabelValues(startupOutcomes[i]).Add(float64(n))
	}
	fault := s.demandFault.WithLabelValues(o.Device)
	for _, e := range o.Events {
		if e.Kind == memdev.Demand && e.ByReady(o.Timings.Ready) {
			fault.Observe(e.Took.Seconds())
		}
	}
}

var _ restore.ReadyObserver = (*Set)(nil)

// observeCacheOf finds the chunk cache of an S3 repository.
func (s *startupMetrics) observeCacheOf(repo repository.Repository) {
	cr, ok := repo.(interface{ Cache() *chunkcache.Cache })
	if !ok || cr.Cache() == nil {
		return
	}
	c := cr.Cache()
	s.cache.Store(c)
	c.ObserveFetches(func(took time.Duration, _ error) { s.cacheGet.Observe(took.Seconds()) })
}

var (
	cacheLookupsDesc = prometheus.NewDesc(metricCacheLookups,
		"S3 node cache block lookups of demand reads, by result: hit (cached), miss (fetched by this read), "+
			"join (waited for a fetch in flight).", []string{"result"}, nil)
	cacheFetchedDesc = prometheus.NewDesc(metricCacheFetchedBytes,
		"Bytes the S3 node cache's ranged GETs returned (demand and prefetch).", nil, nil)
	cacheEvictionsDesc = prometheus.NewDesc(metricCacheEvictions,
		"Blocks the S3 node cache evicted to make room.", nil, nil)
)

// cacheCollector reads the chunk cache's own counters at each scrape.
func (s *startupMetrics) cacheCollector() prometheus.Collector {
	return collectorFunc{
		descs: []*prometheus.Desc{cacheLookupsDesc, cacheFetchedDesc, cacheEvictionsDesc},
		collect: func(ch chan<- prometheus.Metric) {
			var st chunkcache.Stats
			if c := s.cache.Load(); c != nil {
				st = c.Stats()
			}
			for _, l := range []struct {
				result string
				n      uint64
			}{{"hit", st.Hits}, {"miss", st.Misses}, {"join", st.Joins}} {
				ch <- prometheus.MustNewConstMetric(cacheLookupsDesc, prometheus.CounterValue, float64(l.n), l.result)
			}
			ch <- prometheus.MustNewConstMetric(cacheFetchedDesc, prometheus.CounterValue, float64(st.FetchedBytes))
			ch <- prometheus.MustNewConstMetric(cacheEvictionsDesc, prometheus.CounterValue, float64(st.Evictions))
		},
	}
}

// collectorFunc is a collector of fixed descriptions.
type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// buildInfo is the constant 1 labelled with what the go command stamped
// into the binary.
func buildInfo() prometheus.Collector {
	version, revision, goVersion := "(unknown)", "", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        metricBuildInfo,
		Help:        "Always 1; the labels say which build is running: module version, VCS revision (empty when not stamped) and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "go_version": goVersion},
	}, func() float64 { return 1 })
}
