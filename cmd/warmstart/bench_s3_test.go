package main

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/lab/bench"
)

// harnessPackages are what the test harness behind the S3 benchmark links:
// package testing (through internal/lab/miniotest), Toxiproxy and the modules
// it brings (zerolog, gorilla/mux, tomb), and the harness packages
// themselves. The warmstart binary must link none of them.
var harnessPackages = []string{
	"testing",
	"github.com/Shopify/toxiproxy",
	"github.com/rs/zerolog",
	"github.com/gorilla/mux",
	"gopkg.in/tomb",
	"warmstart/internal/lab/miniotest",
	"warmstart/internal/lab/s3bench",
}

// TestProductBinaryLinksNoTestHarness builds warmstart as an operator
// would and reads what went into it: neither its module list nor its
// symbol table names a harness package. The same reading of
// warmstart-s3bench, which links the harness on purpose, must find them,
// so the check cannot pass by seeing nothing.
func TestProductBinaryLinksNoTestHarness(t *testing.T) {
	dir := buildCommands(t)
	if got := harnessLinkedInto(t, filepath.Join(dir, "warmstart")); len(got) > 0 {
		t.Errorf("warmstart links the test harness: %s", strings.Join(got, ", "))
	}
	got := strings.Join(harnessLinkedInto(t, filepath.Join(dir, bench.S3Command)), ", ")
	for _, want := range []string{"module github.com/Shopify/toxiproxy", "symbol testing.", "symbol warmstart/internal/lab/miniotest."} {
		if !strings.Contains(got, want) {
			t.Errorf("the check finds no %q in %s, which links the harness; it found: %s", want, bench.S3Command, got)
		}
	}
}

// TestProductBinaryArmsNoFaultPoint checks the built warmstart binary for
// the crash tests' SIGKILL fault points: neither the variable that arms
// them nor the hook that kills the process is in it (they live in
// posixfs's test files).
func TestProductBinaryArmsNoFaultPoint(t *testing.T) {
	bin := filepath.Join(buildCommands(t), "warmstart")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("WARMSTART_FAULTPOINT")) {
		t.Error("warmstart contains WARMSTART_FAULTPOINT")
	}
	if bytes.Contains(data, []byte("posixfs.faultHookFromEnv")) {
		t.Error("warmstart contains posixfs.faultHookFromEnv")
	}
}

// harnessLinkedInto lists the harness modules in bin's build information
// and one symbol of each harness package in its symbol table.
func harnessLinkedInto(t *testing.T, bin string) []string {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range info.Deps {
		if p := harnessPackage(d.Path); p != "" {
			found = append(found, "module "+d.Path)
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v (built without a symbol table?)", bin, err)
	}
	seen := map[string]bool{}
	for _, s := range syms {
		if p := harnessPackage(s.Name); p != "" && !seen[p] {
			seen[p] = true
			found = append(found, "symbol "+s.Name)
		}
	}
	return found
}

// harnessPackage returns the harness package that name (a module path, or
// a symbol: package path, a dot, the name) belongs to, "" if none.
func harnessPackage(name string) string {
	for _, p := range harnessPackages {
		if rest, ok := strings.CutPrefix(name, p); ok && (rest == "" || strings.ContainsAny(rest[:1], "./%")) {
			return p
		}
	}
	return ""
}

// buildCommands builds warmstart and warmstart-s3bench from this module
// into a directory of the test's own and returns it.
func buildCommands(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		if root := os.Getenv("GOROOT"); root != "" {
			goBin, err = filepath.Join(root, "bin", "go"), nil
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no go command to build the binaries with: %v", err)
		}
		t.Skipf("no go command to build the binaries with: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command(goBin, "build", "-o", dir+"/", "warmstart/cmd/warmstart", "warmstart/cmd/"+bench.S3Command)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// TestBenchS3ExecsTheCompanion runs bench --repository s3 with a stand-in
// companion that prints its arguments: bench hands over its checked flags
// and the companion's exit status becomes bench's.
func TestBenchS3ExecsTheCompanion(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, bench.S3Command)
	script := "#!/bin/sh\necho \"companion $*\"\nexit 7\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(bench.S3BinaryEnv, fake)
	r := runCLI(t, "bench", "--repository", "s3", "--blocks", "3", "--seed", "5", "--memory-size", "8MiB",
		"--policies", "seed", "--s3-latency-ms", "9", "--s3-bandwidth-mbit", "100", "--json", "--json-file", "out.json")
	want := "companion --blocks 3 --seed 5 --memory-size 8388608 --policy seed --s3-latency-ms 9 --s3-bandwidth-mbit 100 --s3-link-mbit 1000" +
		" --readaround-kib 0 --prefetch-readaround-kib 4 --json=true --json-file out.json --plot \n"
	if r.code != 7 || r.stdout != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 7 and stdout %q", r.code, r.stdout, r.stderr, want)
	}
}

// fakeCompanion installs a stand-in companion that prints its arguments
// and exits 7.
func fakeCompanion(t *testing.T) {
	t.Helper()
	fake := filepath.Join(t.TempDir(), bench.S3Command)
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"companion $*\"\nexit 7\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(bench.S3BinaryEnv, fake)
}

// TestBenchS3MeasuresTheConfiguredReadaround runs bench --repository s3
// with a configuration whose [memory] sets both readaround windows: the
// companion is told them, so the run measures that configuration.
func TestBenchS3MeasuresTheConfiguredReadaround(t *testing.T) {
	fakeCompanion(t)
	cfg := filepath.Join(t.TempDir(), "warmstart.toml")
	if err := os.WriteFile(cfg, []byte("[memory]\nreadaround_kib = 64\nprefetch_readaround_kib = 16\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, "--config", cfg, "bench", "--repository", "s3", "--policies", "warmstart")
	if r.code != 7 || !strings.Contains(r.stdout, " --readaround-kib 64 --prefetch-readaround-kib 16 ") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 7 and the configured windows passed on", r.code, r.stdout, r.stderr)
	}
}

// TestBenchS3RefusesFlagsItWouldNotHeed: flags asking for what the S3
// companion does not do are usage errors, before the companion runs;
// flags set to what it does anyway are accepted.
func TestBenchS3RefusesFlagsItWouldNotHeed(t *testing.T) {
	fakeCompanion(t)
	for _, args := range [][]string{
		{"--device", "uffd"}, {"--io-engine", "1"}, {"--io-engine", "buffered_async"}, {"--learn", "2"}, {"--reserve-blocks", "0"},
		{"--vmm", "qemu"}, {"--trace", "x.trace"}, {"--policies", "warmstart+learned"}, {"--policies", "off"},
	} {
		r := runCLI(t, append([]string{"bench", "--repository", "s3", "--policies", "warmstart"}, args...)...)
		if r.code != 2 || strings.Contains(r.stdout, "companion") || !strings.Contains(r.stderr, args[0]) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming %s, companion not run", args, r.code, r.stdout, r.stderr, args[0])
		}
	}
	for _, engine := range []string{"0", "buffered"} {
		r := runCLI(t, "bench", "--repository", "s3", "--policies", "warmstart", "--device", "file", "--io-engine", engine, "--vmm", "replay")
		if r.code != 7 {
			t.Errorf("flags set to what the companion does (--io-engine %s): exit %d, stderr %q; want the companion run (exit 7)", engine, r.code, r.stderr)
		}
	}
}

// TestBenchS3WithoutCompanionSaysHowToBuildIt runs bench --repository s3
// where no companion can be found: it fails (exit 1) naming the command
// that builds it; a WARMSTART_S3BENCH_BINARY that names no executable is
// reported as such.
func TestBenchS3WithoutCompanionSaysHowToBuildIt(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, binary := range []string{"", filepath.Join(t.TempDir(), "missing")} {
		t.Setenv(bench.S3BinaryEnv, binary)
		r := runCLI(t, "bench", "--repository", "s3", "--policies", "seed")
		if r.code != 1 || !strings.Contains(r.stderr, "go build -o DIR ./cmd/warmstart ./cmd/warmstart-s3bench") {
			t.Errorf("%s=%q: exit %d, stderr %q; want exit 1 and how to build the companion", bench.S3BinaryEnv, binary, r.code, r.stderr)
		}
		if binary != "" && !strings.Contains(r.stderr, binary+" is not an executable file") {
			t.Errorf("%s=%q: stderr %q does not name it", bench.S3BinaryEnv, binary, r.stderr)
		}
	}
}
