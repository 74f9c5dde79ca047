package architecture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/token"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layer is one row of the layer table in docs/architecture.md.
type layer struct {
	rank int // 0 for the test harnesses
	name string
	// open layers allow imports between their packages; closed ones only
	// into a package's own subtree.
	open     bool
	packages []string // module-relative import paths
}

func (l layer) String() string {
	if l.rank == 0 {
		return l.name
	}
	return fmt.Sprintf("%s, %d", l.name, l.rank)
}

// harness is the name of the row of test harnesses.
const harnessRank = 0

// tableRow matches a row of the layer table: | rank | layer | kind | packages |.
var tableRow = regexp.MustCompile("^\\|\\s*(\\d+|—)\\s*\\|\\s*([^|]+?)\\s*\\|\\s*(open|closed|—)\\s*\\|\\s*(.+?)\\s*\\|\\s*$")

// readLayers parses the layer table of docs/architecture.md.
func readLayers(t *testing.T, root string) []layer {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	layers, err := parseLayers(f)
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	return layers
}

func parseLayers(r io.Reader) ([]layer, error) {
	var layers []layer
	sc := bufio.NewScanner(r)
	pkg := regexp.MustCompile("`([^`]+)`")
	for sc.Scan() {
		m := tableRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		l := layer{name: m[2], open: m[3] == "open"}
		if m[1] != "—" {
			l.rank, _ = strconv.Atoi(m[1])
		}
		for _, p := range pkg.FindAllStringSubmatch(m[4], -1) {
			l.packages = append(l.packages, modulePath(p[1]))
		}
		if len(l.packages) == 0 {
			return nil, fmt.Errorf("layer %q names no package", l.name)
		}
		layers = append(layers, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(layers) == 0 {
		return nil, errors.New("no layer table (rows | rank | layer | kind | packages |)")
	}
	return layers, nil
}

// modulePath is a package as the table names it ("memdev/uffd",
// "cmd/warmstart") relative to the module: cmd/... as is, the rest under
// internal/.
func modulePath(p string) string {
	if strings.HasPrefix(p, "cmd/") || strings.HasPrefix(p, "internal/") {
		return p
	}
	return "internal/" + p
}

// goPackage is what go list says of one package.
type goPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// listPackages runs go list over the module, with import paths made
// module-relative and only the module's own imports kept.
func listPackages(t *testing.T, root string) map[string]goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	const module = "warmstart/"
	own := func(paths []string) []string {
		var kept []string
		for _, p := range paths {
			if rel, ok := strings.CutPrefix(p, module); ok {
				kept = append(kept, rel)
			}
		}
		return kept
	}
	pkgs := map[string]goPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		p.ImportPath = strings.TrimPrefix(p.ImportPath, module)
		p.Imports, p.Deps = own(p.Imports), own(p.Deps)
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// tree is the module's packages and its layer table, read once per test.
type tree struct {
	layers  []layer
	layerOf map[string]layer
	pkgs    map[string]goPackage
}

func readTree(t *testing.T) tree {
	t.Helper()
	root := moduleRoot(t)
	tr := tree{layers: readLayers(t, root), layerOf: map[string]layer{}, pkgs: listPackages(t, root)}
	for _, l := range tr.layers {
		for _, p := range l.packages {
			tr.layerOf[p] = l
		}
	}
	return tr
}

// TestEveryPackageHasALayer: every package of the module is in exactly one
// row of the table, and every row names packages that exist. A new package
// must be placed.
func TestEveryPackageHasALayer(t *testing.T) {
	tr := readTree(t)
	seen := map[string]string{}
	for _, l := range tr.layers {
		for _, p := range l.packages {
			if other, dup := seen[p]; dup {
				t.Errorf("%s is in two layers: %s and %s", p, other, l)
			}
			seen[p] = l.String()
			if _, ok := tr.pkgs[p]; !ok {
				t.Errorf("layer %s names %s, which is no package of the module", l, p)
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(tr.pkgs)) {
		if _, ok := seen[p]; !ok {
			t.Errorf("%s is in no layer of docs/architecture.md: place it", p)
		}
	}
}

// TestImportsOnlyPointDown: a package imports only packages of lower
// rank, packages of its own layer when the layer is open, and its own
// subtree when it is closed. Two layers of one rank do not import each
// other. Harnesses are checked by TestHarnessesStayInTests.
func TestImportsOnlyPointDown(t *testing.T) {
	tr := readTree(t)
	for _, p := range slices.Sorted(maps.Keys(tr.pkgs)) {
		from, ok := tr.layerOf[p]
		if !ok || from.rank == harnessRank {
			continue
		}
		for _, imp := range tr.pkgs[p].Imports {
			to, ok := tr.layerOf[imp]
			if !ok || to.rank == harnessRank || allowed(p, from, imp, to) {
				continue
			}
			t.Errorf("%s (%s) imports %s (%s): %s", p, from, imp, to, why(from, to))
		}
	}
}

// allowed says whether p, of layer from, may import imp, of layer to.
func allowed(p string, from layer, imp string, to layer) bool {
	switch {
	case to.rank < from.rank:
		return true
	case to.rank > from.rank || to.name != from.name:
		return false
	case from.open:
		return true
	}
	return strings.HasPrefix(imp, p+"/")
}

// why names the rule an import breaks.
func why(from, to layer) string {
	switch {
	case to.rank > from.rank:
		return "imports point down"
	case to.name != from.name:
		return "layers of one rank do not import each other"
	}
	return "a closed layer's packages import only their own subtree"
}

// TestHarnessesStayInTests: no package outside the harness row imports a
// harness from its non-test files, so no test harness is linked into a
// binary.
func TestHarnessesStayInTests(t *testing.T) {
	tr := readTree(t)
	for _, p := range slices.Sorted(maps.Keys(tr.pkgs)) {
		if l, ok := tr.layerOf[p]; ok && l.rank == harnessRank {
			continue
		}
		for _, imp := range tr.pkgs[p].Imports {
			if l, ok := tr.layerOf[imp]; ok && l.rank == harnessRank {
				t.Errorf("%s imports the test harness %s outside its tests", p, imp)
			}
		}
	}
}

// pipeline are the packages that reach the memory devices only through
// memdev's contract; capture may reach the VMM drivers, since it boots
// guests with them.
var pipeline = []string{"internal/restore", "internal/recorder", "internal/learner", "internal/snapcheck"}

// TestDeviceSeam: the pipeline's packages reach no mechanism, not even
// indirectly, and restore's code names no device kind or device package:
// it attaches through memdev.Devices and asks for capabilities.
func TestDeviceSeam(t *testing.T) {
	tr := readTree(t)
	mechanisms := map[string]bool{}
	for _, l := range tr.layers {
		if l.name == "mechanisms" {
			for _, p := range l.packages {
				mechanisms[p] = true
			}
		}
	}
	if len(mechanisms) == 0 {
		t.Fatal("the layer table has no mechanisms row")
	}
	for _, p := range pipeline {
		for _, dep := range tr.pkgs[p].Deps {
			if mechanisms[dep] {
				t.Errorf("%s reaches the mechanism %s", p, dep)
			}
		}
	}
	for _, at := range deviceKindsNamed(t, filepath.Join(moduleRoot(t), "internal", "restore")) {
		t.Errorf("%s: restore attaches through memdev's contract", at)
	}
}

// deviceKindsNamed lists where the non-test code in dir names a device
// kind (memdev.KindFile, memdev.KindUffd, config.Device...) or a device
// package (fusedev, uffd), in identifiers: comments and strings may speak
// of them.
func deviceKindsNamed(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	var found []string
	for _, f := range parseDir(t, fset, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			name := x.Name + "." + sel.Sel.Name
			switch {
			case x.Name == "fusedev" || x.Name == "uffd",
				x.Name == "memdev" && (sel.Sel.Name == "KindFile" || sel.Sel.Name == "KindUffd"),
				x.Name == "config" && strings.HasPrefix(sel.Sel.Name, "Device"):
				pos := fset.Position(sel.Pos())
				found = append(found, fmt.Sprintf("internal/restore/%s:%d names %s", filepath.Base(pos.Filename), pos.Line, name))
			}
			return true
		})
	}
	return found
}
