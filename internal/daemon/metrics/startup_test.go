package metrics

import (
	"bytes"
	"context"
	"io"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"

	"warmstart/internal/chunkcache"
	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

func newSet() *Set {
	return New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
}

// Every labelled series of the outcome metrics exists before any restore,
// so a dashboard reads 0 rather than nothing, and the label sets are the
// fixed ones (no snapshot or restore ids).
func TestOutcomeSeriesExistFromStart(t *testing.T) {
	s := newSet()
	for _, device := range []string{config.DeviceFile, config.DeviceUffd} {
		series(t, s, metricDemandFaultSecs, map[string]string{"device": device})
		for _, pf := range []string{"on", "off", "skipped"} {
			for _, policy := range restore.PolicyNames() {
				series(t, s, metricReadySeconds, map[string]string{"device": device, "prefetch": pf, "policy": policy})
			}
		}
	}
	for _, o := range []string{"in_time", "late", "unused", "missed"} {
		series(t, s, metricStartupPages, map[string]string{"outcome": o})
	}
	for _, r := range []string{"hit", "miss", "join"} {
		series(t, s, metricCacheLookups, map[string]string{"result": r})
	}
	for _, name := range []string{metricCacheFetchedBytes, metricCacheEvictions, metricCacheGetSeconds} {
		series(t, s, name, nil)
	}
	bi := series(t, s, metricBuildInfo, map[string]string{})
	if bi.GetGauge().GetValue() != 1 || len(bi.GetLabel()) != 3 {
		t.Errorf("build info = %v", bi)
	}
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	problems, err := promlint.New(&buf).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "warmstart_") {
			t.Errorf("metric %s: %s", p.Metric, p.Text)
		}
	}
}

func TestRestoreReadyCountsOutcomes(t *testing.T) {
	s := newSet()
	ms := time.Millisecond
	s.RestoreReady(restore.ReadyOutcome{
		Device: config.DeviceUffd, Prefetch: "on", Policy: "warmstart",
		Timings:    restore.Timings{Ready: 40 * ms},
		StartupSet: startupset.Report{InTimePages: 90, LatePages: 7, UnusedPages: 3, MissedPages: 2},
		Events: []startupset.Event{
			{Kind: memdev.Demand, At: 5 * ms, Took: 100 * time.Microsecond},
			{Kind: memdev.Demand, At: 6 * ms, Took: 300 * time.Microsecond},
			{Kind: memdev.Prefetch, At: 7 * ms, Took: time.Millisecond},
			{Kind: memdev.Demand, At: 50 * ms, Took: time.Millisecond}, // after ready
		},
	})
	for o, want := range map[string]float64{"in_time": 90, "late": 7, "unused": 3, "missed": 2} {
		if got := series(t, s, metricStartupPages, map[string]string{"outcome": o}).GetCounter().GetValue(); got != want {
			t.Errorf("%s pages = %v, want %v", o, got, want)
		}
	}
	h := series(t, s, metricDemandFaultSecs, map[string]string{"device": "uffd"}).GetHistogram()
	if h.GetSampleCount() != 2 || math.Abs(h.GetSampleSum()-0.0004) > 1e-9 {
		t.Errorf("demand faults: %d summing to %v, want 2 summing to 0.0004", h.GetSampleCount(), h.GetSampleSum())
	}
	r := series(t, s, metricReadySeconds, map[string]string{"device": "uffd", "prefetch": "on", "policy": "warmstart"}).GetHistogram()
	if r.GetSampleCount() != 1 || math.Abs(r.GetSampleSum()-0.04) > 1e-9 {
		t.Errorf("ready: %d summing to %v", r.GetSampleCount(), r.GetSampleSum())
	}
}

// cachedRepo is a repository whose memory is read through a chunk cache,
// as the S3 repository's is.
type cachedRepo struct {
	posixRepo
	cache *chunkcache.Cache
}

func (r cachedRepo) Cache() *chunkcache.Cache { return r.cache }

func TestChunkCacheMetrics(t *testing.T) {
	cache, err := chunkcache.Open(chunkcache.Options{Dir: t.TempDir(), MaxBytes: 1 << 20, BlockBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	data := bytes.Repeat([]byte{7}, 8192)
	s := newSet()
	s.Repository(cachedRepo{posixRepo: openPosix(t), cache: cache})
	r, err := cache.Open(chunkcache.Object{ID: "obj", Size: int64(len(data)), Fetch: func(_ context.Context, off, n int64) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data[off : off+n])), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 4096)
	for range 2 {
		if _, err := r.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	lookups := func(result string) float64 {
		return series(t, s, metricCacheLookups, map[string]string{"result": result}).GetCounter().GetValue()
	}
	if lookups("miss") != 1 || lookups("hit") != 1 {
		t.Errorf("lookups: %v misses, %v hits; want 1 and 1", lookups("miss"), lookups("hit"))
	}
	if got := series(t, s, metricCacheFetchedBytes, nil).GetCounter().GetValue(); got != 4096 {
		t.Errorf("fetched bytes = %v, want 4096", got)
	}
	if got := series(t, s, metricCacheGetSeconds, nil).GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("GET latency observed %d times, want 1", got)
	}
}

// posixRepo is a real repository to wrap.
type posixRepo = repository.Repository

func openPosix(t *testing.T) posixRepo {
	t.Helper()
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return repo
}
