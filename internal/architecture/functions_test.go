package architecture

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Limits of a function that reads at once: a screenful, a handful of
// branches.
const (
	maxFunctionLines      = 80
	maxFunctionComplexity = 15
)

// TestFunctionsReadAtOnce: no function or method outside tests is longer
// than maxFunctionLines or has a cyclomatic complexity above
// maxFunctionComplexity. Test harnesses are code other tests run, and
// count.
func TestFunctionsReadAtOnce(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			pos := fset.Position(fn.Pos())
			rel, _ := filepath.Rel(root, pos.Filename)
			lines := fset.Position(fn.End()).Line - pos.Line + 1
			if lines > maxFunctionLines {
				t.Errorf("%s:%d: %s is %d lines long (at most %d)", rel, pos.Line, funcName(fn), lines, maxFunctionLines)
			}
			if c := complexity(fn); c > maxFunctionComplexity {
				t.Errorf("%s:%d: %s has cyclomatic complexity %d (at most %d)", rel, pos.Line, funcName(fn), c, maxFunctionComplexity)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// funcName is fn's name, with its receiver's type for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		}
		break
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

// complexity is fn's cyclomatic complexity as gocyclo counts it: one, plus
// one for each if, for, range, case and select case that is not the
// default, && and ||. Function literals count towards the function they
// are written in.
func complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
