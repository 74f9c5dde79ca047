package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"warmstart/internal/vmm"
)

// errorBodyLimitBytes caps how much of an error response is read: Firecracker
// answers with one short fault message, anything longer is not its answer.
const errorBodyLimitBytes = 64 << 10

// APIError is a non-2xx answer from Firecracker's API, carrying the
// fault_message of its Error body.
type APIError struct {
	Method       string
	Path         string
	StatusCode   int
	FaultMessage string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("firecracker %s %s: status %d: %s", e.Method, e.Path, e.StatusCode, e.FaultMessage)
}

// Client speaks Firecracker's HTTP API over its Unix socket. It is safe for
// concurrent use; Firecracker itself serialises requests.
type Client struct {
	socketPath string
	http       *http.Client
}

// NewClient returns a client for the API socket at socketPath.
func NewClient(socketPath string) *Client {
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
	}
	return &Client{socketPath: socketPath, http: &http.Client{Transport: transport}}
}

// CloseIdleConnections drops kept-alive connections, e.g. once the process
// has exited.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// MemoryBackend is SnapshotLoad's mem_backend.
type MemoryBackend struct {
	BackendType vmm.Backend `json:"backend_type"`
	// BackendPath is the memory file (File) or the page-fault handler's
	// Unix socket (Uffd).
	BackendPath string `json:"backend_path"`
}

// VsockOverride rebinds a restored vsock device to a new Unix socket.
type VsockOverride struct {
	UDSPath string `json:"uds_path"`
}

// SnapshotLoad is the body of PUT /snapshot/load. Firecracker refuses a
// field it does not know, so the optional ones are left out unless set:
// track_dirty_pages exists since 1.13 (enable_diff_snapshots is its older
// name, deprecated since), vsock_override since 1.16. The spec also lists
// the deprecated mem_file_path; mem_backend replaces it.
type SnapshotLoad struct {
	SnapshotPath        string         `json:"snapshot_path"`
	MemBackend          MemoryBackend  `json:"mem_backend"`
	TrackDirtyPages     bool           `json:"track_dirty_pages,omitempty"`
	EnableDiffSnapshots bool           `json:"enable_diff_snapshots,omitempty"`
	ResumeVM            bool           `json:"resume_vm"`
	VsockOverride       *VsockOverride `json:"vsock_override,omitempty"`
}

// SnapshotType is SnapshotCreate's snapshot_type.
type SnapshotType string

// Snapshot types.
const (
	SnapshotFull SnapshotType = "Full"
	SnapshotDiff SnapshotType = "Diff"
)

// SnapshotCreate is the body of PUT /snapshot/create.
type SnapshotCreate struct {
	SnapshotType SnapshotType `json:"snapshot_type,omitempty"`
	SnapshotPath string       `json:"snapshot_path"`
	MemFilePath  string       `json:"mem_file_path"`
}

// VMState is the body's state of PATCH /vm.
type VMState string

// VM states.
const (
	VMPaused  VMState = "Paused"
	VMResumed VMState = "Resumed"
)

type vmBody struct {
	State VMState `json:"state"`
}

// BootSource is the body of PUT /boot-source.
type BootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	BootArgs        string `json:"boot_args,omitempty"`
	InitrdPath      string `json:"initrd_path,omitempty"`
}

// CacheType is a drive's cache_type.
type CacheType string

// Drive cache types.
const (
	CacheUnsafe    CacheType = "Unsafe"
	CacheWriteback CacheType = "Writeback"
)

// IOEngine is a drive's io_engine.
type IOEngine string

// Drive IO engines.
const (
	IOEngineSync  IOEngine = "Sync"
	IOEngineAsync IOEngine = "Async"
)

// Drive is the body of PUT /drives/{drive_id} for a virtio-block drive.
type Drive struct {
	DriveID      string    `json:"drive_id"`
	PathOnHost   string    `json:"path_on_host"`
	IsRootDevice bool      `json:"is_root_device"`
	IsReadOnly   bool      `json:"is_read_only"`
	CacheType    CacheType `json:"cache_type,omitempty"`
	IOEngine     IOEngine  `json:"io_engine,omitempty"`
}

// HugePages is MachineConfig's huge_pages.
type HugePages string

// Huge page configurations.
const (
	HugePagesNone        HugePages = "None"
	HugePagesTransparent HugePages = "Transparent"
	HugePages2M          HugePages = "2M"
)

// MachineConfig is the body of PUT and the answer of GET /machine-config.
type MachineConfig struct {
	VCPUCount       int       `json:"vcpu_count"`
	MemSizeMiB      int64     `json:"mem_size_mib"`
	SMT             bool      `json:"smt,omitempty"`
	TrackDirtyPages bool      `json:"track_dirty_pages,omitempty"`
	HugePages       HugePages `json:"huge_pages,omitempty"`
	CPUTemplate     string    `json:"cpu_template,omitempty"`
}

// NetworkInterface is the body of PUT /network-interfaces/{iface_id}.
type NetworkInterface struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
	GuestMAC    string `json:"guest_mac,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
}

// Vsock is the body of PUT /vsock.
type Vsock struct {
	GuestCID uint32 `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

// ActionType is the action_type of PUT /actions.
type ActionType string

// Actions.
const (
	ActionInstanceStart  ActionType = "InstanceStart"
	ActionSendCtrlAltDel ActionType = "SendCtrlAltDel"
	ActionFlushMetrics   ActionType = "FlushMetrics"
)

type actionBody struct {
	ActionType ActionType `json:"action_type"`
}

// vmStateRunning is InstanceInfo.State of a VM whose vCPUs run; the
// others are "Not started" and "Paused".
const vmStateRunning = "Running"

// InstanceInfo is the answer of GET /.
type InstanceInfo struct {
	AppName    string `json:"app_name"`
	ID         string `json:"id"`
	State      string `json:"state"`
	VMMVersion string `json:"vmm_version"`
}

// firecrackerVersion is the answer of GET /version.
type firecrackerVersion struct {
	FirecrackerVersion string `json:"firecracker_version"`
}

// LoadSnapshot sends PUT /snapshot/load. Firecracker answers once the VM
// is loaded, and resumed with resume_vm: with the Uffd backend it has by
// then connected to the handler's socket and faulted guest memory through
// it (writing the VM generation ID), so the handler must serve from before
// the request is sent.
func (c *Client) LoadSnapshot(ctx context.Context, body SnapshotLoad) error {
	return c.do(ctx, http.MethodPut, "/snapshot/load", body, nil)
}

// CreateSnapshot sends PUT /snapshot/create. The VM must be paused.
func (c *Client) CreateSnapshot(ctx context.Context, body SnapshotCreate) error {
	return c.do(ctx, http.MethodPut, "/snapshot/create", body, nil)
}

// SetVMState sends PATCH /vm.
func (c *Client) SetVMState(ctx context.Context, state VMState) error {
	return c.do(ctx, http.MethodPatch, "/vm", vmBody{State: state}, nil)
}

// PutBootSource sends PUT /boot-source.
func (c *Client) PutBootSource(ctx context.Context, body BootSource) error {
	return c.do(ctx, http.MethodPut, "/boot-source", body, nil)
}

// PutDrive sends PUT /drives/{drive_id}.
func (c *Client) PutDrive(ctx context.Context, body Drive) error {
	return c.do(ctx, http.MethodPut, "/drives/"+url.PathEscape(body.DriveID), body, nil)
}

// PutMachineConfig sends PUT /machine-config.
func (c *Client) PutMachineConfig(ctx context.Context, body MachineConfig) error {
	return c.do(ctx, http.MethodPut, "/machine-config", body, nil)
}

// MachineConfig sends GET /machine-config.
func (c *Client) MachineConfig(ctx context.Context) (MachineConfig, error) {
	var mc MachineConfig
	err := c.do(ctx, http.MethodGet, "/machine-config", nil, &mc)
	return mc, err
}

// PutNetworkInterface sends PUT /network-interfaces/{iface_id}.
func (c *Client) PutNetworkInterface(ctx context.Context, body NetworkInterface) error {
	return c.do(ctx, http.MethodPut, "/network-interfaces/"+url.PathEscape(body.IfaceID), body, nil)
}

// PutVsock sends PUT /vsock.
func (c *Client) PutVsock(ctx context.Context, body Vsock) error {
	return c.do(ctx, http.MethodPut, "/vsock", body, nil)
}

// Action sends PUT /actions.
func (c *Client) Action(ctx context.Context, action ActionType) error {
	return c.do(ctx, http.MethodPut, "/actions", actionBody{ActionType: action}, nil)
}

// Version sends GET /version and returns Firecracker's release, e.g.
// "1.16.1".
func (c *Client) Version(ctx context.Context) (string, error) {
	var v firecrackerVersion
	if err := c.do(ctx, http.MethodGet, "/version", nil, &v); err != nil {
		return "", err
	}
	return v.FirecrackerVersion, nil
}

// Describe sends GET /.
func (c *Client) Describe(ctx context.Context) (InstanceInfo, error) {
	var info InstanceInfo
	err := c.do(ctx, http.MethodGet, "/", nil, &info)
	return info, err
}

// do sends one request. in, when not nil, is the JSON body; out, when not
// nil, receives the JSON answer.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("firecracker %s %s: encode body: %w", method, path, err)
		}
		body = bytes.NewReader(data)
	}
	// The host part is ignored: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, body)
	if err != nil {
		return fmt.Errorf("firecracker %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("firecracker %s %s via %s: %w", method, path, c.socketPath, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeAPIError(method, path, resp)
	}
	if out == nil {
		// Drain so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errorBodyLimitBytes))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("firecracker %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func decodeAPIError(method, path string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimitBytes))
	apiErr := &APIError{Method: method, Path: path, StatusCode: resp.StatusCode}
	var body struct {
		FaultMessage *string `json:"fault_message"`
	}
	if err := json.Unmarshal(raw, &body); err == nil && body.FaultMessage != nil {
		apiErr.FaultMessage = *body.FaultMessage
	} else {
		apiErr.FaultMessage = strings.TrimSpace(string(raw))
		if apiErr.FaultMessage == "" {
			apiErr.FaultMessage = http.StatusText(resp.StatusCode)
		}
	}
	return apiErr
}
