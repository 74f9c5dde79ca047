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

func newInProcessFake(t *testing.T) (*Client, *fakeVM, string) {
	t.Helper()
	dir := t.TempDir()
	vm := newFakeVM(fakeConfig{}, "client-test", dir, io.Discard)
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
// a server on a Unix socket and checks each body against firecracker.yaml.
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
		func() error { return c.SetVMState(ctx, VMResumed) },
		func() error { return c.Action(ctx, ActionSendCtrlAltDel) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	records := vm.recorded()

	for _, backend := range []MemoryBackend{
		{BackendType: vmm.BackendFile, BackendPath: filepath.Join(dir, "mem")},
		{BackendType: vmm.BackendUffd, BackendPath: listenUffd(t, t.TempDir())},
	} {
		lc, lvm, ldir := newInProcessFake(t)
		load := SnapshotLoad{SnapshotPath: filepath.Join(dir, "vm.state"), MemBackend: backend, TrackDirtyPages: true, ResumeVM: true}
		if backend.BackendType == vmm.BackendUffd {
			load.VsockOverride = &VsockOverride{UDSPath: filepath.Join(ldir, VsockSocketName)}
		}
		if err := lc.LoadSnapshot(ctx, load); err != nil {
			t.Fatalf("load %s: %v", backend.BackendType, err)
		}
		records = append(records, lvm.recorded()...)
	}

	seen := checkRecords(t, records)
	requireSeen(t, seen,
		"PUT /machine-config", "GET /machine-config", "PUT /boot-source", "PUT /drives/{drive_id}",
		"PUT /network-interfaces/{iface_id}", "PUT /vsock", "GET /",
		"PUT /actions InstanceStart", "PUT /actions SendCtrlAltDel", "PUT /actions FlushMetrics",
		"PATCH /vm Paused", "PATCH /vm Resumed",
		"PUT /snapshot/create Full", "PUT /snapshot/create Diff",
		"PUT /snapshot/load File", "PUT /snapshot/load Uffd",
	)
	if got := records[3].Path; got != "/drives/data%201" && got != "/drives/data 1" {
		t.Errorf("drive id was not carried in the path: %q", got)
	}
}

// listenUffd listens where a page-fault handler would and accepts
// connections until the test ends. It returns the socket path.
func listenUffd(t *testing.T, dir string) string {
	t.Helper()
	path, _ := listenUffdNotify(t, dir)
	return path
}

// listenUffdNotify is listenUffd that also reports each accepted
// connection.
func listenUffdNotify(t *testing.T, dir string) (string, <-chan struct{}) {
	t.Helper()
	path := filepath.Join(dir, "uffd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 16)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return path, accepted
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
