package posixfs

import (
	"os"
	"syscall"
	"testing"

	"warmstart/internal/repository/repotest"
)

// FaultPointEnv names the environment variable that arms a fault point in
// a crash test's child process (childMain): when it holds the name of one
// (for example "publish.after-record-temp"), the child kills itself with
// SIGKILL on reaching that point. It is read here, in a test file, so no
// build but this package's tests can be made to kill itself.
const FaultPointEnv = "WARMSTART_FAULTPOINT"

// faultHookFromEnv returns the hook armed by FaultPointEnv, or nil.
func faultHookFromEnv() func(string) {
	armed := os.Getenv(FaultPointEnv)
	if armed == "" {
		return nil
	}
	return func(point string) {
		if point == armed {
			// SIGKILL cannot be caught: the process dies here with its
			// descriptors (and so its flocks) closed by the kernel, as in a
			// real crash of the holder.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never reached; the signal is delivered first
		}
	}
}

// TestFaultPointEnvArmsNothingOutsideTheCrashTests sets FaultPointEnv in
// this process and publishes, attaches and deletes through a Repo that Open
// made: only a test's own hook arms fault points, so nothing kills the
// process and every operation completes.
func TestFaultPointEnvArmsNothingOutsideTheCrashTests(t *testing.T) {
	for _, point := range []string{FaultPublishAfterDir, FaultAttachAfterManifestTemp, FaultDeleteAfterRecord} {
		t.Run(point, func(t *testing.T) {
			t.Setenv(FaultPointEnv, point)
			r := openTemp(t, Options{})
			if r.faultHook != nil {
				t.Fatal("Open armed a fault hook from the environment")
			}
			rec, lease := repotest.Publish(t, r, "armed")
			if _, err := r.AttachManifest(bg(), lease, []byte("manifest"), nil); err != nil {
				t.Fatal(err)
			}
			if err := lease.End(); err != nil {
				t.Fatal(err)
			}
			if err := r.Delete(bg(), rec.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
