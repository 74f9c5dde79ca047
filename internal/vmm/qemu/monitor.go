package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// monitorDialTimeout bounds connecting to a QMP socket that is already
// listening; the connection completes from the listen backlog at once.
const monitorDialTimeout = 5 * time.Second

// monitor is a QMP connection whose commands honour a context.
// qmp.SocketMonitor blocks in Connect and Run until QEMU answers; the
// watchdogs here close the connection when the context ends, which makes
// the blocked call return.
type monitor struct {
	mon       *qmp.SocketMonitor
	closeOnce sync.Once
}

// dialMonitor connects to the QMP socket at path and negotiates
// capabilities.
func dialMonitor(ctx context.Context, path string, exited <-chan struct{}) (*monitor, error) {
	mon, err := qmp.NewSocketMonitor("unix", path, monitorDialTimeout)
	if err != nil {
		return nil, fmt.Errorf("connect qmp: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- mon.Connect() }()
	select {
	case err := <-done:
		if err != nil {
			mon.Disconnect()
			return nil, fmt.Errorf("qmp handshake: %w", err)
		}
		return &monitor{mon: mon}, nil
	case <-ctx.Done():
		return nil, abandonHandshake(mon, done, fmt.Errorf("qmp handshake: %w", ctx.Err()))
	case <-exited:
		// The listening socket is ours, so a QEMU that died before it
		// greeted leaves the connection waiting in the backlog forever.
		return nil, abandonHandshake(mon, done, errors.New("qmp handshake: qemu exited before its monitor answered"))
	}
}

// abandonHandshake leaves a handshake that will not be answered and
// returns err. Disconnect must not race Connect, which sets fields it
// reads, so it waits for Connect in the background; callers kill QEMU on
// this error path, which ends it.
func abandonHandshake(mon *qmp.SocketMonitor, done <-chan error, err error) error {
	go func() {
		<-done
		mon.Disconnect()
	}()
	return err
}

// execute runs command with args and decodes its "return" value into ret
// when ret is not nil. If ctx ends first, the monitor is closed and can
// take no more commands.
func (m *monitor) execute(ctx context.Context, command string, args, ret any) error {
	req, err := json.Marshal(qmp.Command{Execute: command, Args: args})
	if err != nil {
		return fmt.Errorf("qmp %s: encode: %w", command, err)
	}
	type result struct {
		raw []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		raw, err := m.mon.Run(req)
		done <- result{raw, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		m.close()
		<-done
		return fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
	if r.err != nil {
		return fmt.Errorf("qmp %s: %w", command, r.err)
	}
	if ret == nil {
		return nil
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(r.raw, &resp); err != nil {
		return fmt.Errorf("qmp %s: decode response: %w", command, err)
	}
	if err := json.Unmarshal(resp.Return, ret); err != nil {
		return fmt.Errorf("qmp %s: decode %s: %w", command, resp.Return, err)
	}
	return nil
}

// close ends the connection; commands in flight and later fail.
func (m *monitor) close() {
	m.closeOnce.Do(func() { m.mon.Disconnect() })
}

// migrationCapability is one entry of migrate-set-capabilities.
type migrationCapability struct {
	Capability string `json:"capability"`
	State      bool   `json:"state"`
}

// ignoreShared turns on x-ignore-shared: RAM backed by a shared memory
// backend is neither sent by a migration nor expected by an incoming one.
func (m *monitor) ignoreShared(ctx context.Context) error {
	args := map[string]any{"capabilities": []migrationCapability{{Capability: "x-ignore-shared", State: true}}}
	return m.execute(ctx, "migrate-set-capabilities", args, nil)
}

// migrationStatus is the part of query-migrate's answer the driver reads.
type migrationStatus struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
}

// runStatus is the part of query-status's answer the driver reads.
type runStatus struct {
	Status  string `json:"status"`
	Running bool   `json:"running"`
}
