package initramfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// ModulePath is the import path of the module the agent is built from.
const ModulePath = "warmstart"

// AgentPackage is the agent's package, relative to the module root.
const AgentPackage = "./cmd/warmstart-agent"

// ErrNoModule is returned when no warmstart source tree can be found.
var ErrNoModule = errors.New("warmstart module source not found")

// ModuleRoot finds the root of the warmstart source tree: first from the
// working directory upwards, then from where this package's source was
// compiled (absent in -trimpath builds). A root is a directory whose go.mod
// declares module warmstart and which holds the agent's package.
func ModuleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, start := range starts {
		for dir := start; ; dir = filepath.Dir(dir) {
			if isModuleRoot(dir) {
				return dir, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return "", fmt.Errorf("%w (searched upwards from %s)", ErrNoModule, strings.Join(starts, ", "))
}

func isModuleRoot(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || modulePath(data) != ModulePath {
		return false
	}
	fi, err := os.Stat(filepath.Join(dir, AgentPackage))
	return err == nil && fi.IsDir()
}

// modulePath reads the module directive of a go.mod file.
func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`)
		}
	}
	return ""
}

// BuildAgent compiles the agent from the module at moduleDir into out: a
// static linux/amd64 binary (CGO_ENABLED=0) for the baseline x86-64 level,
// so it runs under any emulated CPU, stripped and without build IDs or VCS
// stamps so identical source gives an identical binary. GOFLAGS from the
// environment is cleared: flags such as -race cannot build a static binary.
func BuildAgent(ctx context.Context, moduleDir, out string) error {
	goBin, err := goTool()
	if err != nil {
		return fmt.Errorf("build agent: %w", err)
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w -buildid=", "-o", out, AgentPackage)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOAMD64=v1", "GOFLAGS=")
	if outErr, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build agent in %s: %w: %s", moduleDir, err, bytes.TrimSpace(outErr))
	}
	return nil
}

// goTool finds the go command: on PATH, else under $GOROOT.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("go command not found on PATH or under GOROOT")
}
