package s3bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"warmstart/internal/chunkcache"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/memdev"
	"warmstart/internal/reexec"
	"warmstart/internal/repository/s3"
	"warmstart/internal/startupset"
	"warmstart/internal/vmm/replay"
)

func TestMain(m *testing.M) {
	reexec.Roles{replay.RoleReplayVMM: replay.ChildMain, RoleLink: LinkMain}.Dispatch()
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

func needMinIO(t *testing.T) {
	t.Helper()
	miniotest.Require(t)
}

// TestSmallRun runs one block on a small reference snapshot: every trial
// reads the right bytes, a warm node cache needs no memory GET, and a cold
// one fetches.
func TestSmallRun(t *testing.T) {
	needMinIO(t)
	rep, err := Run(context.Background(), Options{WorkDir: t.TempDir(), MemoryBytes: 32 << 20, Blocks: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.WriteTable(&out)
	t.Log("\n" + out.String())
	if len(rep.Trials) != len(Conditions) {
		t.Fatalf("%d trials, want %d", len(rep.Trials), len(Conditions))
	}
	for _, tr := range rep.Trials {
		if !tr.HashOK {
			t.Errorf("%s: the guest read wrong bytes", tr.Condition)
		}
		switch tr.Condition.Cache {
		case CacheWarm:
			if tr.Gets != 0 {
				t.Errorf("%s: %d GETs with the whole object cached", tr.Condition, tr.Gets)
			}
		case CacheCold:
			if tr.Gets == 0 {
				t.Errorf("%s: no GET from an empty cache", tr.Condition)
			}
		}
		if tr.Condition.Prefetch == PrefetchOn && tr.Prefetch.State == "skipped" {
			t.Errorf("%s: prefetch skipped: %s", tr.Condition, tr.Prefetch.Reason)
		}
		if tr.Condition == (Condition{Cache: CacheCold, Prefetch: PrefetchOn}) && tr.Timings.StreamFirstBlock <= 0 {
			t.Errorf("%s: no streamed block before ready: %+v", tr.Condition, tr.Timings)
		}
		// A cold node fetches the startup pack and nothing else before
		// ready: the guest touches only startup pages, and a fault reads
		// no neighbour outside the set around them (one-page readaround).
		// Every process of a cold trial ran until ready: the node and the
		// VMM restoring, MinIO serving and the link process forwarding.
		if a := tr.CPU; tr.Condition.Cache == CacheCold && (a.Node <= 0 || a.VMM <= 0 || a.Store <= 0 || a.Link <= 0) {
			t.Errorf("%s: CPU account %+v: a process ran for nothing", tr.Condition, a)
		}
		if tr.Condition == (Condition{Cache: CacheCold, Prefetch: PrefetchOn}) && tr.BytesToReady > uint64(rep.StartupSetStoredBytes) {
			t.Errorf("%s: %d bytes fetched before ready, more than the %d-byte startup pack", tr.Condition, tr.BytesToReady, rep.StartupSetStoredBytes)
		}
	}
	for _, s := range rep.Summary {
		if (s.OverLinkFloor != nil) != (s.Condition.Cache == CacheCold) || rep.LinkFloorMs <= 0 {
			t.Errorf("%s: over the link's floor (%.1f ms) %+v; want a ratio for a cold node only", s.Condition, rep.LinkFloorMs, s.OverLinkFloor)
		}
	}
	for _, table := range []string{"phases (mean ms)", "CPU to ready (mean ms)", "over the link's floor"} {
		if !strings.Contains(out.String(), table) {
			t.Errorf("no %q table", table)
		}
	}
}

// TestDemandStall: the guest's wait is the union of its requests' waits,
// overlapping requests counted once, those after ready left out.
func TestDemandStall(t *testing.T) {
	ms := time.Millisecond
	ev := func(kind memdev.Kind, arrived, at time.Duration) startupset.Event {
		return startupset.Event{Kind: kind, At: at, Took: at - arrived}
	}
	events := []startupset.Event{
		ev(memdev.Demand, 10*ms, 30*ms),
		ev(memdev.Demand, 20*ms, 40*ms),   // overlaps the first: 10 ms more
		ev(memdev.Prefetch, 0, 100*ms),    // not the guest's
		ev(memdev.Demand, 50*ms, 55*ms),   // 5 ms
		ev(memdev.Demand, 52*ms, 54*ms),   // inside the last one
		ev(memdev.Demand, 200*ms, 210*ms), // after ready
	}
	if got := demandStall(events, 100*ms); got != 35*ms {
		t.Fatalf("stall %v, want 35ms", got)
	}
}

// TestFigures runs the full measurement when WARMSTART_S3BENCH is set (it
// takes minutes): WARMSTART_S3BENCH=blocks[,block KiB[,run cap KiB[,concurrency[,MiB]]]].
func TestFigures(t *testing.T) {
	spec := os.Getenv("WARMSTART_S3BENCH")
	if spec == "" {
		t.Skip("set WARMSTART_S3BENCH=blocks[,block KiB[,run cap KiB[,concurrency[,memory MiB]]]] to measure")
	}
	needMinIO(t)
	o := Options{WorkDir: t.TempDir(), Progress: testWriter{t}}
	for i, f := range strings.Split(spec, ",") {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		switch i {
		case 0:
			o.Blocks = int(v)
		case 1:
			o.BlockBytes = v << 10
		case 2:
			o.Warm.RunCapBytes = v << 10
		case 3:
			o.Warm.Concurrency = int(v)
		case 4:
			o.MemoryBytes = v << 20
		}
	}
	if o.BlockBytes == 0 {
		o.BlockBytes = chunkcache.DefaultBlockBytes
	}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.WriteTable(&out)
	t.Log("\n" + out.String())
	if p := os.Getenv("WARMSTART_S3BENCH_JSON"); p != "" {
		if err := os.WriteFile(p, rep.JSON(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestRestoreFetchLeavesTheFillOut: the GETs a trial counts as its
// restore's leave out the background fill's, which the restore's ready
// started and which, on a busy node, runs before the counts are read.
func TestRestoreFetchLeavesTheFillOut(t *testing.T) {
	got := restoreFetch(s3.RequestStats{Gets: 12, GetBytes: 9230278, FillGets: 1, FillGetBytes: 252224, Puts: 3})
	if got.Gets != 11 || got.GetBytes != 8978054 || got.FillGets != 0 || got.FillGetBytes != 0 || got.Puts != 3 {
		t.Fatalf("restore fetch %+v, want 11 GETs of 8978054 bytes and the rest as given", got)
	}
}

// TestParseCondition: the four conditions, each also without the digest
// check, and nothing else.
func TestParseCondition(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Condition
	}{
		{"cold-on", Condition{Cache: CacheCold, Prefetch: PrefetchOn}},
		{"warm-off", Condition{Cache: CacheWarm, Prefetch: PrefetchOff}},
		{"cold-on+noverify", Condition{Cache: CacheCold, Prefetch: PrefetchOn, Unverified: true}},
	} {
		got, err := ParseCondition(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseCondition(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if got := (Condition{Cache: CacheCold, Prefetch: PrefetchOn, Unverified: true}).String(); got != "cold-cache/prefetch-on+noverify" {
		t.Errorf("String = %q", got)
	}
	for _, bad := range []string{"", "cold", "hot-on", "cold-on+verify", "+noverify"} {
		if _, err := ParseCondition(bad); err == nil {
			t.Errorf("ParseCondition(%q) accepted", bad)
		}
	}
}
