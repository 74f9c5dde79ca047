// Package firecracker drives the Firecracker VMM through its documented HTTP
// API (the OpenAPI description firecracker.yaml of each release): it spawns
// one Firecracker process per VM with a private API socket and logs, asks
// it its release and refuses one outside the supported range (MinVersion),
// restores snapshots from a File or Uffd memory backend with the load body
// that release accepts, boots fresh VMs, captures full or diff snapshots
// with the memory layout taken from the VM's machine config, pauses
// pausable restores into Diff snapshots of the pages their guest changed
// (vmm.Pauser, pause.go), and decides readiness by polling the in-guest
// agent's health endpoint.
//
// A snapshot load does more than read files: Firecracker maps guest
// memory, with the Uffd backend connects to the page-fault handler and
// hands it the userfaultfd, writes a new VM generation ID into guest
// memory, and with resume_vm resumes the vCPUs, all before it answers. A
// Uffd handler must therefore serve faults from before the load is sent,
// and the load has its own bound (Options.LoadTimeout).
//
// Stopping follows what Firecracker supports: SendCtrlAltDel asks the guest
// to reboot, which makes Firecracker exit; a guest that does not go within
// the stop timeout is killed, and one that is not running (paused), which
// could not act on it, is killed at once. With the Uffd backend a VM whose page-fault
// handler dies would hang its vCPUs on the next fault forever, so the driver
// kills it as soon as the handler is gone.
package firecracker

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Defaults for the zero fields of Options.
const (
	DefaultPollInterval = 10 * time.Millisecond
	DefaultProbeTimeout = 500 * time.Millisecond
	DefaultReadyTimeout = 30 * time.Second
	DefaultStartTimeout = 5 * time.Second
	DefaultStopTimeout  = 5 * time.Second
	DefaultLogLevel     = "Warning"
	// DefaultLoadTimeout bounds PUT /snapshot/load. A load reads the VM
	// state, maps memory and takes a few faults on it (the generation ID
	// write), each served by warmstart's own memory device: milliseconds
	// on a healthy host, and that device gives up on a read it cannot
	// finish within memdev.StuckReadWait (10 s). A load still unanswered
	// after three times that waits on something that will not come (a
	// handler that never serves, a VMM wedged in the kernel) and would
	// otherwise hold the restore for ever; the ready timeout does not
	// start until the load has answered.
	DefaultLoadTimeout = 30 * time.Second
)

// Errors callers branch on.
var (
	// ErrHandlerDied: the Uffd page-fault handler stopped while the VM
	// ran, so the driver killed the VM.
	ErrHandlerDied = errors.New("firecracker: the page-fault handler died; VM killed")
	// ErrExited is wrapped by ExitError: the process exited without
	// being asked to stop.
	ErrExited = errors.New("firecracker exited unexpectedly")
	// ErrStopped: the VM was asked to stop before the guest agent answered.
	ErrStopped = errors.New("firecracker: VM stopped before the guest agent answered")
	// ErrNotReady: the guest agent did not answer within the ready timeout.
	ErrNotReady = errors.New("guest agent not ready")
	// ErrLoadTimeout: Firecracker did not answer the snapshot load
	// within Options.LoadTimeout; the VM was killed.
	ErrLoadTimeout = errors.New("firecracker: snapshot load not answered in time")
	// ErrInvalidOptions is wrapped by every error New returns.
	ErrInvalidOptions = errors.New("invalid firecracker options")
)

// Options configure the driver. They come from the [firecracker] and [agent]
// sections of the configuration.
type Options struct {
	// Binary is the Firecracker executable.
	Binary string
	// LogLevel is passed as --level: Error, Warning, Info, Debug, Trace
	// or Off.
	LogLevel string

	// EnvdAddress is the guest agent's health endpoint, in one of three
	// forms:
	//   http://169.254.0.21:49983/health   plain HTTP GET
	//   unix:/run/agent.sock               GET /health over a Unix socket;
	//                                      a relative path is taken inside
	//                                      the instance's runtime directory
	//   vsock:49983                        GET /health through Firecracker's
	//                                      vsock device (needs Vsock)
	EnvdAddress string
	// PollInterval separates health probes.
	PollInterval time.Duration
	// ProbeTimeout bounds each probe, so one lost connection cannot eat
	// the whole ready timeout.
	ProbeTimeout time.Duration
	// ReadyTimeout bounds WaitReady.
	ReadyTimeout time.Duration

	// StartTimeout bounds the wait for the API socket to accept.
	StartTimeout time.Duration
	// StopTimeout is how long a guest has to shut down after
	// SendCtrlAltDel before it is killed.
	StopTimeout time.Duration
	// LoadTimeout bounds the snapshot load (DefaultLoadTimeout says why).
	LoadTimeout time.Duration

	// TrackDirtyPages has every snapshot load track dirty pages, so that
	// diff snapshots can be taken of restored VMs (CaptureSpec.Type). A
	// pausable restore (vmm.RestoreSpec.Pausable) tracks them whatever
	// this says.
	TrackDirtyPages bool
	// Uffd says restores use the Uffd backend (the uffd memory device):
	// Check then also verifies that Firecracker may create a userfaultfd
	// on this host.
	Uffd bool
	// Vsock says the snapshots carry a vsock device. Each restore then
	// rebinds it to <RuntimeDir>/vsock.sock (vsock_override), so that
	// restores of one snapshot do not fight over the socket recorded in it.
	Vsock bool
}

// logLevels are the values Firecracker's --level accepts (case-insensitive).
var logLevels = []string{"Error", "Warning", "Info", "Debug", "Trace", "Off"}

// withDefaults returns o with defaults filled in, or an error naming the
// first bad field.
func (o Options) withDefaults() (Options, error) {
	if o.Binary == "" {
		return o, fmt.Errorf("%w: binary is empty", ErrInvalidOptions)
	}
	if o.LogLevel == "" {
		o.LogLevel = DefaultLogLevel
	}
	known := false
	for _, l := range logLevels {
		if strings.EqualFold(l, o.LogLevel) {
			o.LogLevel, known = l, true
		}
	}
	if !known {
		return o, fmt.Errorf("%w: log level %q is not one of %s", ErrInvalidOptions, o.LogLevel, strings.Join(logLevels, ", "))
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"poll interval", &o.PollInterval, DefaultPollInterval},
		{"probe timeout", &o.ProbeTimeout, DefaultProbeTimeout},
		{"ready timeout", &o.ReadyTimeout, DefaultReadyTimeout},
		{"start timeout", &o.StartTimeout, DefaultStartTimeout},
		{"stop timeout", &o.StopTimeout, DefaultStopTimeout},
		{"load timeout", &o.LoadTimeout, DefaultLoadTimeout},
	} {
		switch {
		case *d.v < 0:
			return o, fmt.Errorf("%w: %s %v is negative", ErrInvalidOptions, d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if o.EnvdAddress != "" {
		addr, err := parseAgentAddress(o.EnvdAddress)
		if err != nil {
			return o, fmt.Errorf("%w: envd address: %v", ErrInvalidOptions, err)
		}
		if addr.kind == agentVsock && !o.Vsock {
			return o, fmt.Errorf("%w: envd address %q needs the vsock option", ErrInvalidOptions, o.EnvdAddress)
		}
	}
	return o, nil
}

// Driver restores, boots and captures Firecracker VMs. It holds no state
// between VMs; each Machine owns its process.
type Driver struct {
	opts Options
}

// New returns a driver for opts, with defaults filled in.
func New(opts Options) (*Driver, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Driver{opts: opts}, nil
}

// Options returns the driver's options with defaults filled in.
func (d *Driver) Options() Options { return d.opts }
