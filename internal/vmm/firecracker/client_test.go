package firecracker

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/vmm"
)

// serveFake answers Firecracker's API in-process on a real Unix socket in
// dir, and returns a client for it.
func serveFake(t *testing.T, dir string, h http.Handler) *Client {
	t.Helper()
	sock := filepath.Join(dir, APISocketName)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return NewClient(sock)
}

// newInProcessFake serves a fake playing the newest release in this
// process. It never maps memory served by a handler of this process: a
// Uffd load goes to a fake process (process_test.go).
func newInProcessFake(t *testing.T) (*Client, *fakeVM, string) {
	t.Helper()
	dir := t.TempDir()
	vm, err := newFakeVM(fakeConfig{SpecPath: specPath(newestFakeVersion)}, "client-test", dir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.close)
	return serveFake(t, dir, vm), vm, dir
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestClientRequestsMatchSpec sends every request the client can build to
// a server on a Unix socket and checks each body against the newest
// release's API description.
func TestClientRequestsMatchSpec(t *testing.T) {
	ctx := testContext(t)
	c, vm, dir := newInProcessFake(t)
	steps := []func() error{
		func() error {
			return c.PutMachineConfig(ctx, MachineConfig{VCPUCount: 2, MemSizeMiB: 256, SMT: true, TrackDirtyPages: true, HugePages: HugePagesNone})
		},
		func() error {
			return c.PutBootSource(ctx, BootSource{KernelImagePath: "/k", BootArgs: DefaultBootArgs, InitrdPath: "/i"})
		},
		func() error {
			return c.PutDrive(ctx, Drive{DriveID: "rootfs", PathOnHost: "/r", IsRootDevice: true, CacheType: CacheWriteback, IOEngine: IOEngineAsync})
		},
		func() error {
			return c.PutDrive(ctx, Drive{DriveID: "data 1", PathOnHost: "/d", IsReadOnly: true})
		},
		func() error {
			return c.PutNetworkInterface(ctx, NetworkInterface{IfaceID: "eth0", HostDevName: "tap0", GuestMAC: "06:00:ac:10:00:02", MTU: 1500})
		},
		func() error { return c.PutVsock(ctx, Vsock{GuestCID: 3, UDSPath: filepath.Join(dir, VsockSocketName)}) },
		func() error { return c.Action(ctx, ActionInstanceStart) },
		func() error { return c.Action(ctx, ActionFlushMetrics) },
		func() error { return c.SetVMState(ctx, VMPaused) },
		func() error {
			return c.CreateSnapshot(ctx, SnapshotCreate{SnapshotType: SnapshotFull, SnapshotPath: filepath.Join(dir, "vm.state"), MemFilePath: filepath.Join(dir, "mem")})
		},
		func() error {
			return c.CreateSnapshot(ctx, SnapshotCreate{SnapshotType: SnapshotDiff, SnapshotPath: filepath.Join(dir, "vm.state"), MemFilePath: filepath.Join(dir, "mem")})
		},
		func() error {
			mc, err := c.MachineConfig(ctx)
			if err == nil && (mc.VCPUCount != 2 || mc.MemSizeMiB != 256 || !mc.TrackDirtyPages) {
				err = errors.New("GET /machine-config decoded wrong")
			}
			return err
		},
		func() error {
			info, err := c.Describe(ctx)
			if err == nil && info.State != "Paused" {
				err = errors.New("GET / decoded wrong: " + info.State)
			}
			return err
		},
		func() error {
			v, err := c.Version(ctx)
			if err == nil && v != newestFakeVersion {
				err = errors.New("GET /version decoded wrong: " + v)
			}
			return err
		},
		func() error { return c.SetVMState(ctx, VMResumed) },
		func() error { return c.Action(ctx, ActionSendCtrlAltDel) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	records := vm.recorded()

	lc, lvm, ldir := newInProcessFake(t)
	load := SnapshotLoad{
		SnapshotPath:    filepath.Join(dir, "vm.state"),
		MemBackend:      MemoryBackend{BackendType: vmm.BackendFile, BackendPath: filepath.Join(dir, "mem")},
		TrackDirtyPages: true, ResumeVM: true,
		VsockOverride: &VsockOverride{UDSPath: filepath.Join(ldir, VsockSocketName)},
	}
	if err := lc.LoadSnapshot(ctx, load); err != nil {
		t.Fatalf("load: %v", err)
	}
	records = append(records, lvm.recorded()...)

	seen := checkRecords(t, newestFakeVersion, records)
	requireSeen(t, seen,
		"PUT /machine-config", "GET /machine-config", "PUT /boot-source", "PUT /drives/{drive_id}",
		"PUT /network-interfaces/{iface_id}", "PUT /vsock", "GET /", "GET /version",
		"PUT /actions InstanceStart", "PUT /actions SendCtrlAltDel", "PUT /actions FlushMetrics",
		"PATCH /vm Paused", "PATCH /vm Resumed",
		"PUT /snapshot/create Full", "PUT /snapshot/create Diff",
		"PUT /snapshot/load File",
	)
	if got := records[3].Path; got != "/drives/data%201" && got != "/drives/data 1" {
		t.Errorf("drive id was not carried in the path: %q", got)
	}
}

func TestClientDecodesFaults(t *testing.T) {
	ctx := testContext(t)
	c, _, _ := newInProcessFake(t)

	err := c.SetVMState(ctx, VMPaused)
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("PATCH /vm before start: %v, want an APIError", err)
	}
	if apiErr.StatusCode != http.StatusBadRequest || apiErr.FaultMessage != "The microVM is not running." || apiErr.Method != http.MethodPatch || apiErr.Path != "/vm" {
		t.Fatalf("APIError %+v", apiErr)
	}

	plain := serveFake(t, t.TempDir(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/actions" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	for _, c := range []struct {
		call func() error
		code int
		msg  string
	}{
		{func() error { return plain.SetVMState(ctx, VMResumed) }, 500, "boom"},
		{func() error { return plain.Action(ctx, ActionInstanceStart) }, 503, "Service Unavailable"},
	} {
		err := c.call()
		if !errors.As(err, &apiErr) || apiErr.StatusCode != c.code || apiErr.FaultMessage != c.msg {
			t.Errorf("got %v, want status %d with %q", err, c.code, c.msg)
		}
	}

	missing := NewClient(filepath.Join(t.TempDir(), "none.sock"))
	if err := missing.Action(ctx, ActionInstanceStart); err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("dial error %v does not name the socket", err)
	}
}
