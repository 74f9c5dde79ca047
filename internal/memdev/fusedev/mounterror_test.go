package fusedev

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// A mount refused for want of privilege says what it needs; other
// failures are passed on as they are.
func TestMountErrorSaysWhatAMountNeeds(t *testing.T) {
	err := mountError("/run/ws/mem", syscall.EPERM)
	if !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "needs root, or CAP_SYS_ADMIN") {
		t.Errorf("EPERM: %v", err)
	}
	if err := mountError("/run/ws/mem", syscall.ENODEV); strings.Contains(err.Error(), "root") {
		t.Errorf("ENODEV: %v names root", err)
	}
}
