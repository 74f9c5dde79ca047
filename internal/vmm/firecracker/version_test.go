package firecracker

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
)

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{
		"1.16.1":            {Major: 1, Minor: 16, Patch: 1},
		"v1.12.0":           {Major: 1, Minor: 12},
		"1.17.0-dev":        {Major: 1, Minor: 17, Pre: "dev"},
		"1.13.0+fuzzing":    {Major: 1, Minor: 13},
		"2.0.0-rc1+fuzzing": {Major: 2, Pre: "rc1"},
	} {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1.16", "1.16.1.2", "1.x.0", "1.-1.0", "1.16.0-", "fake"} {
		if v, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) = %v, want an error", bad, v)
		}
	}
}

func TestVersionOrder(t *testing.T) {
	ordered := []string{"1.11.0", "1.12.0-dev", "1.12.0", "1.12.1", "1.13.0", "1.17.0-dev", "1.17.0", "2.0.0"}
	for i := range ordered {
		for j := range ordered {
			a, _ := ParseVersion(ordered[i])
			b, _ := ParseVersion(ordered[j])
			if got, want := a.AtLeast(b), i >= j; got != want {
				t.Errorf("%s.AtLeast(%s) = %v, want %v", a, b, got, want)
			}
		}
	}
}

func TestCheckVersion(t *testing.T) {
	for _, c := range []struct {
		version string
		want    []string // nil: supported
	}{
		{"1.12.0", nil},
		{"1.17.0-dev", nil},
		{"1.99.3", nil},
		{"1.11.0", []string{"1.11.0", "1.12.0", "oldest"}},
		{"1.12.0-dev", []string{"1.12.0-dev", "1.12.0"}},
		{"2.0.0", []string{"2.0.0", "major version"}},
	} {
		v, err := ParseVersion(c.version)
		if err != nil {
			t.Fatal(err)
		}
		err = checkVersion(v)
		if c.want == nil {
			if err != nil {
				t.Errorf("checkVersion(%s) = %v, want it supported", v, err)
			}
			continue
		}
		if !errors.Is(err, ErrUnsupportedVersion) {
			t.Errorf("checkVersion(%s) = %v, want ErrUnsupportedVersion", v, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("checkVersion(%s) = %q, which does not name %q", v, err, w)
			}
		}
	}
}

// TestVendoredSpecsAreTheirReleases: each vendored API description is the
// release its name says, and the fake plays every one of them.
func TestVendoredSpecsAreTheirReleases(t *testing.T) {
	files, err := filepath.Glob(specPath("*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(fakeVersions) {
		t.Errorf("testdata has %d descriptions %v, the fake plays %d releases %v", len(files), files, len(fakeVersions), fakeVersions)
	}
	for _, version := range fakeVersions {
		if got := loadSpec(t, version).Info.Version; got != version {
			t.Errorf("%s describes API version %q", specPath(version), got)
		}
	}
}

// TestDriverRequestsMatchSpec boots, captures (full, then diff) and
// restores (File, and Uffd paused) through fake Firecracker processes
// playing each supported release, which like the real ones refuse a body
// field they do not know, and checks every request against that release's
// API description. The load body carries dirty page tracking under the
// name the release knows, and vsock_override only where it exists.
func TestDriverRequestsMatchSpec(t *testing.T) {
	for _, version := range fakeVersions {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			driverRequestsMatchSpec(t, version)
		})
	}
}

func driverRequestsMatchSpec(t *testing.T, version string) {
	v, _ := ParseVersion(version)
	vsock := v.AtLeast(vsockOverrideSince)
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	d := newTestDriver(t, fakeConfig{Version: version, Agent: true, RecordPath: record},
		func(o *Options) { o.Vsock = vsock; o.TrackDirtyPages = true })
	snap := bootAndCapture(t, d, v)

	fileSpec := vmm.RestoreSpec{SnapshotID: "s", VMStatePath: snap.VMStatePath, Backend: vmm.BackendFile, MemPath: snap.MemPath, RuntimeDir: t.TempDir()}
	uffdSpec := fileSpec
	uffdSpec.MemPath, _ = serveUffd(t, snap.MemPath)
	uffdSpec.Backend, uffdSpec.RuntimeDir, uffdSpec.Paused = vmm.BackendUffd, t.TempDir(), true
	for _, spec := range []vmm.RestoreSpec{fileSpec, uffdSpec} {
		restoreReadyStop(t, d, spec)
	}

	records := readRecords(t, record)
	seen := checkRecords(t, version, records)
	want := []string{
		"GET /version", "PUT /machine-config", "PUT /boot-source", "PUT /drives/{drive_id}",
		"PUT /network-interfaces/{iface_id}", "PUT /actions InstanceStart",
		"PATCH /vm Paused", "PATCH /vm Resumed", "PUT /snapshot/create Full", "PUT /snapshot/create Diff",
		"GET /machine-config", "PUT /snapshot/load File", "PUT /snapshot/load Uffd", "PUT /actions SendCtrlAltDel",
	}
	if vsock {
		want = append(want, "PUT /vsock")
	}
	requireSeen(t, seen, want...)
	checkLoadBodies(t, v, records, vsock)
}

// bootAndCapture boots a VM that tracks dirty pages on release v,
// captures it in full and resumed, then as a diff and stopped; it returns
// the full snapshot.
func bootAndCapture(t *testing.T, d *Driver, v Version) CaptureSpec {
	t.Helper()
	ctx := testContext(t)
	bootDir := t.TempDir()
	iface := NetworkInterface{HostDevName: "tap0", GuestMAC: "06:00:ac:10:00:02"}
	if v.AtLeast(mtuSince) {
		iface.MTU = 1500
	}
	m, err := d.Boot(ctx, BootSpec{
		RuntimeDir: bootDir, Kernel: "/vmlinux", Initrd: "/initrd", Rootfs: "/rootfs.ext4",
		VCPUs: 2, MemoryMiB: 256, HugePages: HugePagesNone, TrackDirtyPages: true,
		NetworkInterfaces: []NetworkInterface{iface},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	snapDir := t.TempDir()
	full := CaptureSpec{VMStatePath: filepath.Join(snapDir, "vm.state"), MemPath: filepath.Join(snapDir, "mem"), After: ResumeAfterCapture}
	l, err := m.Capture(ctx, full)
	if err != nil {
		t.Fatal(err)
	}
	if want := layout.Single(256 << 20); !l.Equal(want) {
		t.Fatalf("layout %v, want %v", l, want)
	}
	if _, err := m.WaitReady(ctx); err != nil {
		t.Fatalf("resumed after capture: %v", err)
	}
	diff := CaptureSpec{VMStatePath: filepath.Join(snapDir, "vm2.state"), MemPath: filepath.Join(snapDir, "mem2"), After: StopAfterCapture, Type: SnapshotDiff}
	if _, err := m.Capture(ctx, diff); err != nil {
		t.Fatal(err)
	}
	if exit, ok := m.Exit(); !ok || exit.KillReason != KillCaptured {
		t.Fatalf("after a capture that stops: exit %+v, exited %v", exit, ok)
	}
	requireGone(t, bootDir)
	return full
}

// restoreReadyStop restores spec (resuming a paused load), waits for the
// agent and stops the VM.
func restoreReadyStop(t *testing.T, d *Driver, spec vmm.RestoreSpec) {
	t.Helper()
	ctx := testContext(t)
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{})
	if err != nil {
		t.Fatalf("%s restore: %v", spec.Backend, err)
	}
	if spec.Paused {
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.WaitReady(ctx); err != nil {
		t.Fatalf("%s restore: %v", spec.Backend, err)
	}
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	requireGone(t, spec.RuntimeDir)
}

// checkLoadBodies checks the optional fields of every load v received.
func checkLoadBodies(t *testing.T, v Version, records []recordedRequest, vsock bool) {
	t.Helper()
	tracking := "track_dirty_pages"
	if !v.AtLeast(trackDirtyPagesSince) {
		tracking = "enable_diff_snapshots"
	}
	loads := 0
	for _, r := range records {
		if r.Path != "/snapshot/load" {
			continue
		}
		loads++
		var body map[string]any
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{"track_dirty_pages", "enable_diff_snapshots"} {
			got, want := body[field], field == tracking
			if want && got != true || !want && got != nil {
				t.Errorf("firecracker %s: load %s: %s is %v, want it only as %s", v, r.Body, field, got, tracking)
			}
		}
		if _, ok := body["vsock_override"]; ok != vsock {
			t.Errorf("firecracker %s: load %s: vsock_override present %v, want %v", v, r.Body, ok, vsock)
		}
	}
	if loads != 2 {
		t.Errorf("firecracker %s received %d loads, want 2", v, loads)
	}
}

// TestVersionBelowFloorRefused: a Firecracker older than MinVersion is
// refused at launch, before any other request, with an error naming its
// release and the floor; the process is gone.
func TestVersionBelowFloorRefused(t *testing.T) {
	ctx := testContext(t)
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	d := newTestDriver(t, fakeConfig{Version: "1.11.0", RecordPath: record}, nil)
	spec := fileRestore(t, 16)
	_, err := d.Restore(ctx, spec)
	if !errors.Is(err, ErrUnsupportedVersion) || !strings.Contains(err.Error(), "1.11.0") || !strings.Contains(err.Error(), MinVersion.String()) {
		t.Fatalf("restore with firecracker 1.11.0: %v, want ErrUnsupportedVersion naming 1.11.0 and %s", err, MinVersion)
	}
	requireGone(t, spec.RuntimeDir)
	bootDir := t.TempDir()
	if _, err := d.Boot(ctx, BootSpec{RuntimeDir: bootDir, Kernel: "/vmlinux"}); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("boot with firecracker 1.11.0: %v, want ErrUnsupportedVersion", err)
	}
	requireGone(t, bootDir)
	for _, r := range readRecords(t, record) {
		if r.Method != "GET" || r.Path != "/version" {
			t.Errorf("firecracker 1.11.0 was sent %s %s", r.Method, r.Path)
		}
	}
}

// TestWhatTheReleaseLacksIsRefused: asked for what its release cannot do,
// the driver refuses with an error naming the release and the one that
// can, rather than send a field the release would refuse or leave out
// what was asked for. With a vsock agent address every restore rebinds
// the vsock device (vsock_override, 1.16); a boot may set an interface's
// MTU (1.16). A boot with a vsock device needs neither.
func TestWhatTheReleaseLacksIsRefused(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{Version: "1.15.1", Agent: true}, func(o *Options) { o.Vsock = true })
	m, err := d.Boot(ctx, BootSpec{RuntimeDir: t.TempDir(), Kernel: "/vmlinux"})
	if err != nil {
		t.Fatalf("boot with vsock on firecracker 1.15.1: %v", err)
	}
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	spec := fileRestore(t, 16)
	_, err = d.Restore(ctx, spec)
	if !errors.Is(err, ErrUnsupportedVersion) || !strings.Contains(err.Error(), "1.15.1") || !strings.Contains(err.Error(), vsockOverrideSince.String()) {
		t.Fatalf("vsock restore on firecracker 1.15.1: %v, want ErrUnsupportedVersion naming 1.15.1 and %s", err, vsockOverrideSince)
	}
	requireGone(t, spec.RuntimeDir)
	bootDir := t.TempDir()
	_, err = d.Boot(ctx, BootSpec{RuntimeDir: bootDir, Kernel: "/vmlinux", NetworkInterfaces: []NetworkInterface{{HostDevName: "tap0", MTU: 9000}}})
	if !errors.Is(err, ErrUnsupportedVersion) || !strings.Contains(err.Error(), "MTU") || !strings.Contains(err.Error(), mtuSince.String()) {
		t.Fatalf("boot with an MTU on firecracker 1.15.1: %v, want ErrUnsupportedVersion naming the MTU and %s", err, mtuSince)
	}
	requireGone(t, bootDir)
}
