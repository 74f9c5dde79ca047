package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"warmstart/internal/api/apitest"
)

// TestBenchRefusesBadDriftUpFront: a --drift no run can play is a usage
// error before anything is synthesized, booted or started.
func TestBenchRefusesBadDriftUpFront(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--drift", "1.5"}, "--drift: drift 1.5"},
		{[]string{"--drift", "0.2", "web"}, "only the reference snapshot"},
		{[]string{"--drift", "0.2", "--vmm", "qemu"}, "only the replay VMM plays drifting variants"},
		{[]string{"--drift", "0.2", "--blocks", "500"}, "every trial plays its own variant"},
	} {
		r := runCLI(t, append([]string{"bench", "--memory-size", "8MiB", "--policies", "seed"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// TestBenchDriftReportsTheStartupSet: bench --drift prints the startup-set
// outcomes per policy and prints them, and each trial's variant, with
// --json on stdout (the table on stderr) and to --json-file, in the JSON
// convention.
func TestBenchDriftReportsTheStartupSet(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bench.json")
	r := runCLI(t, "bench", "--drift", "0.2", "--blocks", "1", "--reserve-blocks", "1", "--no-hot", "--device", "uffd",
		"--memory-size", "8MiB", "--policies", "warmstart", "--json", "--json-file", out)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"drift 0.20", "startup-set pages in time / late / unused", "pages missed"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stderr)
		}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != r.stdout {
		t.Errorf("--json-file holds other bytes than --json printed:\n%s", r.stdout)
	}
	apitest.CheckConvention(t, "bench --json", data)
	var rep struct {
		Options struct {
			Drift float64 `json:"drift"`
		} `json:"options"`
		Trials []struct {
			Spec struct {
				Variant int `json:"variant"`
			} `json:"spec"`
			StartupSet struct {
				StartupSetPages int64 `json:"startup_set_pages"`
			} `json:"startup_set"`
			Events []any `json:"events"`
		} `json:"trials"`
		Summary struct {
			Cells []struct {
				StartupSet map[string]float64 `json:"startup_set"`
			} `json:"cells"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Options.Drift != 0.2 || len(rep.Trials) < 4 || len(rep.Summary.Cells) != 4 {
		t.Fatalf("drift %v, %d trials, %d cells", rep.Options.Drift, len(rep.Trials), len(rep.Summary.Cells))
	}
	for _, tr := range rep.Trials {
		if tr.Spec.Variant < 1 || tr.StartupSet.StartupSetPages == 0 || tr.Events != nil {
			t.Errorf("trial: variant %d, startup set of %d pages, %d events", tr.Spec.Variant, tr.StartupSet.StartupSetPages, len(tr.Events))
		}
	}
	for _, key := range []string{"in_time_pages", "late_pages", "unused_pages", "missed_pages", "missed_percent"} {
		if _, ok := rep.Summary.Cells[0].StartupSet[key]; !ok {
			t.Errorf("cell startup_set lacks %s", key)
		}
	}
}

// TestBenchUsesTheConfiguredReadaround: "--config FILE bench" mounts its
// trials' devices with FILE's [memory] windows, and says which: its first
// line and its --json options and trial specs.
func TestBenchUsesTheConfiguredReadaround(t *testing.T) {
	dir := t.TempDir()
	configFile, out := filepath.Join(dir, "config.toml"), filepath.Join(dir, "bench.json")
	toml := fmt.Sprintf("[memory]\nreadaround_kib = 256\nprefetch_readaround_kib = 64\n[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n",
		filepath.Join(dir, "store"), filepath.Join(dir, "run"))
	if err := os.WriteFile(configFile, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, "--config", configFile, "bench", "--blocks", "1", "--reserve-blocks", "1", "--no-hot", "--device", "file",
		"--memory-size", "8MiB", "--policies", "warmstart", "--json-file", out)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if first, _, _ := strings.Cut(r.stderr, "\n"); !strings.Contains(first, "256 KiB") || !strings.Contains(first, "64 KiB") {
		t.Errorf("first line %q does not name the windows 256 KiB and 64 KiB", first)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	type windows struct {
		Serving     int `json:"readaround_bytes"`
		Prefetching int `json:"prefetch_readaround_bytes"`
	}
	var rep struct {
		Options struct {
			Readaround windows `json:"readaround"`
		} `json:"options"`
		Trials []struct {
			Spec struct {
				Readaround windows `json:"readaround"`
			} `json:"spec"`
		} `json:"trials"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	want := windows{256 << 10, 64 << 10}
	if rep.Options.Readaround != want || len(rep.Trials) == 0 {
		t.Fatalf("options' readaround %+v over %d trials, want %+v", rep.Options.Readaround, len(rep.Trials), want)
	}
	for i, tr := range rep.Trials {
		if tr.Spec.Readaround != want {
			t.Errorf("trial %d mounted with %+v, want %+v", i, tr.Spec.Readaround, want)
		}
	}
}
