package bench

import (
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/memdev/fusedev"
)

// The operator's [memory] windows become the bench's: readaround_kib for
// the serving mount, prefetch_readaround_kib for restores that prefetch.
func TestReadaroundOfTheConfiguration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("[memory]\nreadaround_kib = 256\nprefetch_readaround_kib = 64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ReadaroundOf(cfg), (Readaround{ServingBytes: 256 << 10, PrefetchingBytes: 64 << 10}); got != want {
		t.Fatalf("ReadaroundOf = %+v, want %+v", got, want)
	}
	if got, want := ReadaroundOf(config.Default()), (Readaround{ServingBytes: 0, PrefetchingBytes: config.DefaultPrefetchReadaroundKiB << 10}); got != want {
		t.Fatalf("ReadaroundOf(defaults) = %+v, want %+v", got, want)
	}
}

// A trial mounts its devices with the windows its spec carries: a
// prefetching mount with the prefetch window, or none when that is the
// serving mount's window already.
func TestTrialMountsItsSpecsReadaround(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		window                       Readaround
		wantServing, wantPrefetching int // 0: no prefetching mount
	}{
		{"non-default prefetch window", Readaround{PrefetchingBytes: 64 << 10}, fusedev.DefaultReadAheadBytes, 64 << 10},
		{"both windows set", Readaround{ServingBytes: 256 << 10, PrefetchingBytes: 16 << 10}, 256 << 10, 16 << 10},
		{"one window for both", Readaround{ServingBytes: 32 << 10, PrefetchingBytes: 32 << 10}, 32 << 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &trial{spec: TrialSpec{Condition: Condition{CacheCold, "warmstart"}, Device: config.DeviceFile,
				WorkDir: t.TempDir(), Readaround: tc.window}}
			unmount, err := tr.setUp()
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := unmount(); err != nil {
					t.Error(err)
				}
			}()
			mounts := tr.r.Devices[0].(*fusedev.Opener)
			if got := mounts.Serving.ReadAheadBytes(); got != tc.wantServing {
				t.Errorf("serving mount's window %d, want %d", got, tc.wantServing)
			}
			switch p := mounts.Prefetching; {
			case tc.wantPrefetching == 0 && p != nil:
				t.Errorf("a prefetching mount (window %d) beside a serving mount of the same window", p.ReadAheadBytes())
			case tc.wantPrefetching != 0 && p == nil:
				t.Errorf("no prefetching mount, want one of window %d", tc.wantPrefetching)
			case p != nil && p.ReadAheadBytes() != tc.wantPrefetching:
				t.Errorf("prefetching mount's window %d, want %d", p.ReadAheadBytes(), tc.wantPrefetching)
			}
		})
	}
}
