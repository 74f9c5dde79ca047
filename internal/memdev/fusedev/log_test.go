package fusedev

import (
	"log/slog"
	"strings"
	"testing"

	"warmstart/internal/logtest"
)

// TestLibraryMessagesGoToTheLog: what the FUSE library prints (its
// request trace with Debug, and its notes about requests the kernel gave
// up on) goes to Options.Log as structured records, not raw to stderr.
func TestLibraryMessagesGoToTheLog(t *testing.T) {
	var out logtest.Buffer
	newServer(t, Options{Debug: true, Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	logged := out.String()
	if !strings.Contains(logged, "level=DEBUG") || !strings.Contains(logged, "INIT") || !strings.Contains(logged, "component=fuse") {
		t.Fatalf("the library's trace of the mount's INIT was not logged as DEBUG records of component fuse:\n%s", logged)
	}
}

// TestLibraryMessageLevels: the request trace and a reply the kernel no
// longer waits for (its request was interrupted: the VM was killed) are
// routine, so DEBUG; anything else the library says is not.
func TestLibraryMessageLevels(t *testing.T) {
	for line, want := range map[string]slog.Level{
		"writer: Write/Writev failed, err: 2=no such file or directory. opcode: READ": slog.LevelDebug,
		"rx 5: READ i4 {Fh 0 [0 +4096)  L 0 RDONLY,0x8000} p5874":                     slog.LevelDebug,
		"tx 5:     OK,  4096b data":                                                   slog.LevelDebug,
		"Failed to read from fuse conn: 5=input/output error":                         slog.LevelWarn,
		"writer: Write/Writev failed, err: 22=invalid argument. opcode: READ":         slog.LevelWarn,
		"parseRequest: 22=invalid argument":                                           slog.LevelWarn,
	} {
		if got := libraryLevel(line); got != want {
			t.Errorf("%q logged at %v, want %v", line, got, want)
		}
	}
}
