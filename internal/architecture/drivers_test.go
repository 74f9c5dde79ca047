package architecture

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/vmm"
)

// TestDriverKeysHaveOneSpelling: a VMM driver's key ([vmm] driver, --vmm)
// is spelled once, as a Driver constant of package vmm. Every driver
// package's DriverKey refers to one of them, one package a constant; vmm
// lists them all (with the state format each restores); the
// configuration's values are auto and exactly those; and no code compares
// a value with a key spelled out as a string. A new driver with its key
// spelled anywhere else fails here.
func TestDriverKeysHaveOneSpelling(t *testing.T) {
	tr := readTree(t)
	root := moduleRoot(t)
	keys := stringConsts(t, filepath.Join(root, "internal", "vmm"), "Driver")
	if len(keys) == 0 {
		t.Fatal("package vmm spells no Driver constant")
	}
	used := map[string]string{}
	for _, p := range driverPackages(tr) {
		name, err := driverKeyRef(t, filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if _, ok := keys[name]; !ok {
			t.Errorf("%s: DriverKey = vmm.%s, which is no Driver constant of package vmm", p, name)
		}
		if other, dup := used[name]; dup {
			t.Errorf("%s and %s both have the key vmm.%s", other, p, name)
		}
		used[name] = p
	}
	for name, key := range keys {
		if _, ok := used[name]; !ok {
			t.Errorf("vmm.%s (%q) is no driver package's DriverKey", name, key)
		}
		if vmm.DriverFormat(key) == vmm.FormatUnknown {
			t.Errorf("vmm.%s (%q) restores no state format (vmm.DriverFormat)", name, key)
		}
	}
	want := slices.Sorted(func(yield func(string) bool) {
		for _, k := range keys {
			if !yield(k) {
				return
			}
		}
	})
	if got := slices.Sorted(slices.Values(vmm.Drivers())); !slices.Equal(got, want) {
		t.Errorf("vmm.Drivers() = %q, want the Driver constants %q", got, want)
	}
	if got := slices.Sorted(slices.Values(config.Drivers())); !slices.Equal(got, slices.Sorted(slices.Values(append([]string{config.DriverAuto}, want...)))) {
		t.Errorf("config.Drivers() = %q, want %q and the Driver constants %q", got, config.DriverAuto, want)
	}
	for name, key := range stringConsts(t, filepath.Join(root, "internal", "config"), "Driver") {
		if name != "DriverAuto" {
			t.Errorf("config.%s spells %q: name vmm's constant", name, key)
		}
	}
	for _, at := range keysSpelledOut(t, root, tr, want) {
		t.Error(at)
	}
}

// driverPackages are the mechanisms under vmm: the drivers.
func driverPackages(tr tree) []string {
	var drivers []string
	for _, l := range tr.layers {
		if l.name != "mechanisms" {
			continue
		}
		for _, p := range l.packages {
			if strings.HasPrefix(p, "internal/vmm/") {
				drivers = append(drivers, p)
			}
		}
	}
	return drivers
}

// parseDir parses the non-test Go files of dir.
func parseDir(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// constSpecs calls fn with every top-level constant of the files, its
// name and its value's expression.
func constSpecs(files []*ast.File, fn func(name string, value ast.Expr)) {
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						fn(n.Name, vs.Values[i])
					}
				}
			}
		}
	}
}

// stringConsts maps the names of dir's top-level string constants that
// start with prefix to their values.
func stringConsts(t *testing.T, dir, prefix string) map[string]string {
	t.Helper()
	consts := map[string]string{}
	constSpecs(parseDir(t, token.NewFileSet(), dir), func(name string, value ast.Expr) {
		lit, ok := value.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || !strings.HasPrefix(name, prefix) {
			return
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			t.Fatal(err)
		}
		consts[name] = s
	})
	return consts
}

// driverKeyRef is the name of the vmm constant a driver package's
// DriverKey is, or an error if it has none or spells its own.
func driverKeyRef(t *testing.T, dir string) (string, error) {
	t.Helper()
	var ref string
	err := errors.New("declares no DriverKey")
	constSpecs(parseDir(t, token.NewFileSet(), dir), func(name string, value ast.Expr) {
		if name != "DriverKey" {
			return
		}
		if sel, ok := value.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "vmm" {
				ref, err = sel.Sel.Name, nil
				return
			}
		}
		err = fmt.Errorf("DriverKey is %s, want one of package vmm's Driver constants", types.ExprString(value))
	})
	return ref, err
}

// keysSpelledOut lists where the module's non-test code compares a value
// with a driver key written as a string literal (== "qemu", case "qemu"),
// rather than with the key's constant.
func keysSpelledOut(t *testing.T, root string, tr tree, keys []string) []string {
	t.Helper()
	var found []string
	fset := token.NewFileSet()
	isKey := func(e ast.Expr) bool {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return false
		}
		s, err := strconv.Unquote(lit.Value)
		return err == nil && slices.Contains(keys, s)
	}
	report := func(e ast.Expr) {
		pos := fset.Position(e.Pos())
		rel, _ := filepath.Rel(root, pos.Filename)
		found = append(found, fmt.Sprintf("%s:%d compares with the driver key %s: use its constant", rel, pos.Line, e.(*ast.BasicLit).Value))
	}
	for p := range tr.pkgs {
		for _, f := range parseDir(t, fset, filepath.Join(root, p)) {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BinaryExpr:
					if n.Op == token.EQL || n.Op == token.NEQ {
						for _, e := range []ast.Expr{n.X, n.Y} {
							if isKey(e) {
								report(e)
							}
						}
					}
				case *ast.CaseClause:
					for _, e := range n.List {
						if isKey(e) {
							report(e)
						}
					}
				}
				return true
			})
		}
	}
	return found
}
