package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
)

// TestConcurrentTrialsTimeTheSlowestOfNRestores runs one block with two
// concurrent restores per trial: every trial starts two VMMs that both
// read the right bytes, and its time is the slower one's.
func TestConcurrentTrialsTimeTheSlowestOfNRestores(t *testing.T) {
	ctx := context.Background()
	o := Options{Device: config.DeviceFile, Blocks: 1, ReserveBlocks: 1, Seed: 6, Policies: []string{"warmstart"},
		Hot: true, WorkDir: t.TempDir(), Progress: t.Output(), Concurrency: 2}
	if err := UseReference(ctx, &o, 8<<20); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Summary.AllHashesOK || rep.Options.Concurrency != 2 {
		t.Fatalf("hashes ok %v, concurrency %d", rep.Summary.AllHashesOK, rep.Options.Concurrency)
	}
	for _, res := range rep.Trials {
		if res.Spec.Block < 0 || !res.Admitted {
			continue
		}
		if len(res.ConcurrentReady) != 2 || res.SlowestReady != slices.Max(res.ConcurrentReady) {
			t.Errorf("%s: ready %v of %v, want the slowest of two", res.Spec.Condition, res.SlowestReady, res.ConcurrentReady)
		}
		if len(res.Concurrent) != 2 || res.HostCPU == nil || res.HostCPU.Busy+res.HostCPU.Idle+res.HostCPU.IOWait <= 0 {
			t.Errorf("%s: per-restore account %+v, host CPU %+v: want two restores and the host's CPU", res.Spec.Condition, res.Concurrent, res.HostCPU)
		}
		// Both restores read one shared generation of the 8 MiB memory:
		// no byte of it twice.
		if res.Cost.LowerBytesRead > 8<<20 {
			t.Errorf("%s: trial cost read %d bytes of an 8 MiB memory both restores share", res.Spec.Condition, res.Cost.LowerBytesRead)
		}
		var vmms time.Duration
		for _, c := range res.Concurrent {
			vmms += c.VMMCPU
		}
		if res.Cost.VMM == nil || res.Cost.VMM.CPU() != vmms {
			t.Errorf("%s: trial cost's VMM CPU %+v, want every restore's summed: %v", res.Spec.Condition, res.Cost.VMM, vmms)
		}
		for i, c := range res.Concurrent {
			if tm := c.Timings; tm.Ready != res.ConcurrentReady[i] || tm.VMStarted <= 0 || tm.VMStarted > tm.Ready || c.VMMCPU <= 0 {
				t.Errorf("%s: restore %d: %+v, ready %v", res.Spec.Condition, i, c, res.ConcurrentReady[i])
			}
		}
		// The baseline and the timed two (and a hot control's own).
		if len(res.ReplayPIDs) < 3 {
			t.Errorf("%s: %d VMM processes, want the baseline's and two timed", res.Spec.Condition, len(res.ReplayPIDs))
		}
	}
	var out strings.Builder
	rep.WriteTable(&out)
	if !strings.Contains(out.String(), "2 concurrent restores per trial") || !strings.Contains(out.String(), "/ VMMs summed (ms, mean)") {
		t.Errorf("the table does not say the run was concurrent:\n%s", out.String())
	}
}

func TestPassthroughColumnNeedsTheFileDevice(t *testing.T) {
	o := Options{Device: config.DeviceUffd, Blocks: 1, Policies: []string{"warmstart+passthrough"}}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "FUSE passthrough is the file device's") {
		t.Fatalf("uffd with a passthrough column: %v", err)
	}
}

func TestConcurrencyIsChecked(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Concurrency: -1}, "want 1..16"},
		{Options{Concurrency: 17}, "want 1..16"},
		{Options{Concurrency: 4, VMM: config.DriverQEMU}, "needs the replay VMM"},
		{Options{Concurrency: 4, Policies: []string{"warmstart" + LearnedSuffix}}, "learns from one restore"},
	} {
		if err := tc.o.validateConcurrency(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
	for _, n := range []int{0, 1, 4, 16} {
		if err := (&Options{Concurrency: n, Policies: []string{"warmstart"}}).validateConcurrency(); err != nil {
			t.Errorf("--concurrency %d: %v", n, err)
		}
	}
}

func TestParseHostCPU(t *testing.T) {
	h, ok := parseHostCPU("cpu  100 5 50 1000 20 3 2 1 0 0")
	want := HostCPU{Busy: 1610 * time.Millisecond, Idle: 10 * time.Second, IOWait: 200 * time.Millisecond, IRQ: 50 * time.Millisecond}
	if !ok || h != want {
		t.Fatalf("parsed %+v %v, want %+v", h, ok, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if _, ok := parseHostCPU(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
