package api

import (
	"errors"
	"net/http"
	"syscall"

	"warmstart/internal/repository"
)

// UnavailableStatus is the HTTP status of a request that failed for want
// of a resource rather than through its client or a bug: 507 when a disk
// (a pause's staging directory, the store, the node cache) refused to
// store (no space or quota left, ENOSPC or EDQUOT; a read-only file
// system, EROFS), 503 when the store did not answer
// (repository.ErrUnreachable). It is 0 for any other error. It reads the
// error's chain, never its text, and a daemon's answer (an *APIError of
// 507 or 503) keeps its status: the daemon answers with it, and the CLI
// exits the same way in process and through a daemon.
func UnavailableStatus(err error) int {
	var ae *APIError
	switch {
	case errors.As(err, &ae) && (ae.StatusCode == http.StatusInsufficientStorage || ae.StatusCode == http.StatusServiceUnavailable):
		return ae.StatusCode
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EROFS):
		return http.StatusInsufficientStorage
	case errors.Is(err, repository.ErrUnreachable):
		return http.StatusServiceUnavailable
	}
	return 0
}
