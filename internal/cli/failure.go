package cli

// A verb run with --json promises one JSON document on stdout. A failing
// verb's error goes to stderr as always, and, when the verb wrote nothing
// to stdout before it failed, its stdout gets the error as a document too,
// so a script that parses stdout gets something it can parse whatever
// happened (an empty stdout is no JSON).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/spf13/cobra"

	"warmstart/internal/repository"
)

// Stdout is the verbs' standard output: it counts what they write, so a
// failure document is never appended to a document a verb already wrote
// (snapshot verify --json prints its report and then fails).
type Stdout struct {
	W       io.Writer
	written atomic.Int64
}

func (s *Stdout) Write(p []byte) (int, error) {
	n, err := s.W.Write(p)
	s.written.Add(int64(n))
	return n, err
}

// Failure is the document a verb run with --json prints on stdout when it
// fails: the message it printed on stderr and the status it exits with.
type Failure struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// ReportFailure prints err on stderr, and as a Failure on stdout when the
// verb that failed (cmd, as cobra's ExecuteC returned it) was asked for
// --json and wrote nothing there yet. It returns the exit status.
func ReportFailure(cmd *cobra.Command, args []string, err error, stdout *Stdout, stderr io.Writer) int {
	code := ExitCode(err)
	err = withNextStep(cmd, err)
	fmt.Fprintf(stderr, "warmstart: %v\n", err)
	if stdout.written.Load() == 0 && jsonRequested(cmd, args) {
		doc, _ := json.MarshalIndent(Failure{Error: err.Error(), ExitCode: code}, "", "  ")
		fmt.Fprintf(stdout, "%s\n", doc)
	}
	return code
}

// jsonRequested says whether the failed verb has --json and was given it.
// A verb whose flags failed to parse may not have seen it, so the
// arguments are read too, up to "--".
func jsonRequested(cmd *cobra.Command, args []string) bool {
	if cmd == nil {
		return false
	}
	f := cmd.Flags().Lookup("json")
	if f == nil || f.Value.Type() != "bool" {
		return false
	}
	if f.Changed {
		return f.Value.String() == "true"
	}
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "--json=true", "--json=1":
			return true
		}
	}
	return false
}

// withNextStep adds what to do next to an error a new operator meets
// first: a snapshot named by a verb that takes an ID or ALIAS (its usage
// line says so) that the repository or daemon does not have is most
// often a mistyped name, or the right name in another repository; a
// restore id the daemon does not hold, a typo or one already stopped.
func withNextStep(cmd *cobra.Command, err error) error {
	if cmd == nil || !errors.Is(err, repository.ErrNotFound) {
		return err
	}
	switch {
	case strings.Contains(cmd.Use, "ID|ALIAS"):
		return fmt.Errorf("%w (`warmstart snapshot list` lists the snapshots there are)", err)
	case cmd.HasParent() && cmd.Parent().Name() == "restores":
		return fmt.Errorf("%w (`warmstart restores list` lists the restores the daemon holds)", err)
	}
	return err
}
