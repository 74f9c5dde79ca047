// Package ops holds the operations a node offers its callers — the
// daemon's handlers and the CLI's in-process verbs — each written once.
// An operation takes a node or a repository and the caller's request,
// returns values and prints nothing: a handler decodes, calls and encodes,
// a verb calls and prints through package report.
//
// Errors keep the repository's sentinels (repository.ErrNotFound,
// ErrInvalidRequest, ErrAliasConflict) and trust.ErrUntrusted in their
// chain, so that each front maps them its own way: the daemon to a status,
// the CLI to an exit status. A *SnapshotError says the named snapshot could
// not be found or resolved, as opposed to the operation failing on it; a
// *FieldError names the request field a value was refused in.
package ops
