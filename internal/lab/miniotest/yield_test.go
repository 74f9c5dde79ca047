package miniotest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// After YieldCPU every thread of the server runs at nice 19, and the
// server still serves.
func TestYieldCPULowersEveryThread(t *testing.T) {
	s := Start(t)
	if err := s.YieldCPU(); err != nil {
		t.Fatal(err)
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(s.cmd.Process.Pid), "task", "*", "stat"))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads of the server: %v, %v", tasks, err)
	}
	for _, path := range tasks {
		if nice := niceOf(t, path); nice != 19 {
			t.Errorf("%s: nice %d, want 19", path, nice)
		}
	}
	if err := s.MakeBucket(context.Background(), "after-yield"); err != nil {
		t.Fatalf("the server no longer serves: %v", err)
	}
}

// niceOf reads the nice value of a thread from its stat file (field 19;
// the command name, field 2, is in parentheses and may hold spaces).
func niceOf(t *testing.T, statPath string) int {
	t.Helper()
	data, err := os.ReadFile(statPath)
	if err != nil {
		t.Fatal(err)
	}
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	fields := strings.Fields(rest) // from field 3 on
	nice, err := strconv.Atoi(fields[19-3])
	if err != nil {
		t.Fatalf("%s: nice field %q: %v", statPath, fields[19-3], err)
	}
	return nice
}
