package qemu

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"warmstart/internal/agentspec"
	"warmstart/internal/vmm"
)

var _ vmm.StateAgent = (*Machine)(nil)

// WriteState has the agent make key a buffer of kib KiB filled with the
// pattern of seed (agentspec.Fill), every page written and held for the
// life of the guest, and returns its digest as the agent read it back;
// agentspec.StateDigest(kib, seed) predicts it. A key that is not 1-64 of
// [0-9A-Za-z._-] or a size the agent refuses (its cap is half the guest's
// memory) is an error wrapping vmm.ErrStateRefused; an agent older than
// the request, one wrapping vmm.ErrNoStateAgent. Call it on a ready
// machine.
func (m *Machine) WriteState(ctx context.Context, key string, kib int64, seed uint64) (string, error) {
	if !agentspec.ValidKey(key) {
		return "", fmt.Errorf("write state: %w: key %q is not 1-%d of [0-9A-Za-z._-]", vmm.ErrStateRefused, key, agentspec.MaxKeyBytes)
	}
	if kib <= 0 {
		return "", fmt.Errorf("write state %s: %w: %d KiB", key, vmm.ErrStateRefused, kib)
	}
	ans, err := m.agent.ask(ctx, m.exited, verbWrite, key, strconv.FormatInt(kib, 10), strconv.FormatUint(seed, 10))
	if err != nil {
		return "", m.withLog(fmt.Errorf("write state %s: %w", key, err))
	}
	switch {
	case ans.verb == verbErr:
		return "", fmt.Errorf("write state %s: %w: %s", key, vmm.ErrStateRefused, strings.Join(ans.args, " "))
	case ans.verb != verbWrote || len(ans.args) != 2 || ans.args[0] != key || !isDigest(ans.args[1]):
		return "", fmt.Errorf("write state %s: the agent answered %q", key, strings.Join(append([]string{ans.verb, ans.nonce}, ans.args...), " "))
	}
	return ans.args[1], nil
}

// State returns every state buffer's digest by key, each read again from
// guest memory by the agent. Errors are WriteState's.
func (m *Machine) State(ctx context.Context) (map[string]string, error) {
	ans, err := m.agent.ask(ctx, m.exited, verbState)
	if err != nil {
		return nil, m.withLog(fmt.Errorf("read state: %w", err))
	}
	switch ans.verb {
	case verbErr:
		return nil, fmt.Errorf("read state: %w: %s", vmm.ErrStateRefused, strings.Join(ans.args, " "))
	case verbState:
		return parseState(ans.args)
	}
	return nil, fmt.Errorf("read state: the agent answered %s to STATE", ans.verb)
}

// parseState reads the key=digest pairs of a STATE answer.
func parseState(pairs []string) (map[string]string, error) {
	state := make(map[string]string, len(pairs))
	for _, p := range pairs {
		key, digest, ok := strings.Cut(p, "=")
		if !ok || !agentspec.ValidKey(key) || !isDigest(digest) {
			return nil, fmt.Errorf("read state: the agent answered %q, not key=digest", p)
		}
		if _, dup := state[key]; dup {
			return nil, fmt.Errorf("read state: the agent named %s twice", key)
		}
		state[key] = digest
	}
	return state, nil
}

// isDigest: 16 hex digits, as agentspec.Digest writes them.
func isDigest(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 16 && err == nil
}
