package daemon_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"warmstart/internal/daemon"
	"warmstart/internal/restore"
)

// A pause refused because of the restore's own state is the client's
// conflict to resolve (stop the restore), not the daemon's failure.
func TestPauseRefusalsAreConflicts(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"not pausable", fmt.Errorf("restore r: %w", restore.ErrNotPausable), http.StatusConflict},
		{"pause in progress", restore.ErrPauseInProgress, http.StatusConflict},
		{"pages lost at an earlier pause", fmt.Errorf("restore r: %w", restore.ErrPagesLost), http.StatusConflict},
		{"the VM exited", fmt.Errorf("restore r: %w", restore.ErrVMExited), http.StatusConflict},
		{"shutting down", errors.New("x"), http.StatusServiceUnavailable},
		{"anything else", errors.New("disk full"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var cause error
			if c.want == http.StatusServiceUnavailable {
				cause = daemon.ErrShuttingDown
			}
			if got := daemon.PauseFailedStatus(c.err, cause); got != c.want {
				t.Fatalf("status %d, want %d", got, c.want)
			}
		})
	}
}
