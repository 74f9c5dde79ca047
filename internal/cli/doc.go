// Package cli is the plumbing the command line's verbs share — those of
// cmd/warmstart and the lab's — so that each verb only parses its own
// flags, calls an operation (package ops, or the daemon through api.Client)
// and prints through package report: usage errors (exit 2), the
// configuration loaded once per verb (Env), the --config, --store and
// --daemon flags, the VMM flags and the node an in-process verb restores
// with, signals turned into cancellation, and the wording of errors about
// a named snapshot. It also holds the bodies of some cmd/warmstart verbs
// (Env.Import, Env.Verify, Env.Flatten, Env.Pause, RestoreStopped), whose
// cobra commands, flags and help stay in cmd/warmstart.
package cli
