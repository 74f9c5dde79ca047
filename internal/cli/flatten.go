package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"warmstart/internal/ops"
	"warmstart/internal/report"
)

// Flatten is snapshot flatten: it merges the memory layers of the
// snapshot ref names, in this process, and prints the result (as JSON
// with asJSON).
func (e *Env) Flatten(cmd *cobra.Command, ref string, opts ops.FlattenOptions, asJSON bool) error {
	if e.Daemon != "" {
		return Error{Err: errors.New("snapshot flatten has no --daemon yet: it runs in this process, on the repository its configuration names")}
	}
	repo, err := e.OpenRepository(cmd)
	if err != nil {
		return fmt.Errorf("snapshot flatten: %w", err)
	}
	if c, ok := repo.(io.Closer); ok {
		defer c.Close()
	}
	return Interruptible(cmd, func(ctx context.Context) error {
		res, err := ops.Flatten(ctx, repo, ref, opts)
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		if asJSON {
			return report.JSON(w, res)
		}
		if !res.Flattened {
			_, err = fmt.Fprintf(w, "snapshot %s: nothing to flatten (depth %d)\n", res.ID, res.DepthBefore)
			return err
		}
		_, err = fmt.Fprintf(w, "snapshot %s flattened: depth %d -> %d, %d bytes of memory stored\n",
			res.ID, res.DepthBefore, res.DepthAfter, res.StoredBytes)
		return err
	})
}
