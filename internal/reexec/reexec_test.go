package reexec_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/reexec"
)

func TestMain(m *testing.M) {
	reexec.Roles{
		"echo-role": func() int {
			// The role sees its own variable cleared.
			if _, set := os.LookupEnv(reexec.Env); set {
				return 3
			}
			return 7
		},
	}.Dispatch()
	os.Exit(m.Run())
}

func TestWithout(t *testing.T) {
	env := reexec.Env
	got := reexec.Without([]string{"A=1", env + "=x", env + "X=2", "B=" + env + "=y"})
	if want := []string{"A=1", env + "X=2", "B=" + env + "=y"}; !slices.Equal(got, want) {
		t.Errorf("Without = %q, want %q", got, want)
	}
	got = reexec.Environ([]string{env + "=old", "A=1"}, "new")
	if want := []string{"A=1", env + "=new"}; !slices.Equal(got, want) {
		t.Errorf("Environ = %q, want %q", got, want)
	}
}

// TestDispatch re-executes this test binary in a role it has, which
// exits with the role's status and a clear environment, and in one it
// lacks, which exits 2 naming the roles it has.
func TestDispatch(t *testing.T) {
	run := func(name string) (int, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = reexec.Environ(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), name)
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := run("echo-role"); code != 7 {
		t.Errorf("echo-role exited %d (%s), want 7", code, out)
	}
	if code, out := run("no-such-role"); code != 2 || !strings.Contains(out, "echo-role") || !strings.Contains(out, "no-such-role") {
		t.Errorf("an unknown role exited %d with %q, want 2 naming it and the roles there are", code, out)
	}
}
