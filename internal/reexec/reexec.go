// Package reexec is the registry of the parts one executable can play, after
// moby's reexec: warmstart re-executes itself as the replay VMM, as QEMU's
// launcher and as a benchmark trial, and its test binaries as their own
// children. The environment variable Env names the role; each main (and
// each TestMain) lists the roles its executable has in one Roles value and
// calls Dispatch first, so a reader sees every part the executable can
// play in one place.
package reexec

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// Env names the role a process of this executable plays; unset, it plays
// its main part (the CLI, or the tests).
const Env = "WARMSTART_ROLE"

// Main is a role's entry point; it returns the process's exit status.
type Main func() int

// Roles are the roles an executable has, by name.
type Roles map[string]Main

// badRoleStatus is the exit status of a process started with a role its
// executable does not have.
const badRoleStatus = 2

// Dispatch runs the role Env names and exits with its status; it returns
// at once when Env is unset. Env is cleared before the role runs, so the
// children a role starts play only the roles they are given.
func (r Roles) Dispatch() {
	name, ok := os.LookupEnv(Env)
	if !ok || name == "" {
		return
	}
	os.Unsetenv(Env)
	run, ok := r[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: this executable has no such role (it has %s)\n", Env, name, strings.Join(r.names(), ", "))
		os.Exit(badRoleStatus)
	}
	os.Exit(run())
}

func (r Roles) names() []string {
	out := make([]string, 0, len(r))
	for n := range r {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// With returns r and more in one new Roles (more wins on equal names).
func (r Roles) With(more Roles) Roles {
	out := make(Roles, len(r)+len(more))
	for n, m := range r {
		out[n] = m
	}
	for n, m := range more {
		out[n] = m
	}
	return out
}

// Environ returns env with Env set to name, any earlier value removed: the
// environment of a child that plays name.
func Environ(env []string, name string) []string {
	return append(Without(env), Env+"="+name)
}

// Without returns env without Env.
func Without(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, Env+"=") {
			out = append(out, kv)
		}
	}
	return out
}
