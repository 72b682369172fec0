package elasticps_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docPackage is what a package declares that its readers may name: top-level identifiers, and
// the methods and fields of its types ("Type.Name").
type docPackage struct {
	dir   string
	names map[string]bool
}

// modulePackages parses the non-test files of every package of the module (examples included)
// and returns them by package name. A name that two packages share maps to the first found.
func modulePackages(t *testing.T) map[string]*docPackage {
	t.Helper()
	out := map[string]*docPackage{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		name := f.Name.Name
		p := out[name]
		if p == nil {
			p = &docPackage{dir: filepath.Dir(path), names: map[string]bool{}}
			out[name] = p
		} else if p.dir != filepath.Dir(path) {
			return nil // another package of the same name: the first one stands
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					p.names[decl.Name.Name] = true
					continue
				}
				recv := decl.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if idx, ok := recv.(*ast.IndexExpr); ok {
					recv = idx.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					p.names[id.Name+"."+decl.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						p.names[spec.Name.Name] = true
						addMembers(p.names, spec.Name.Name, spec.Type)
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							p.names[n.Name] = true
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// addMembers records the fields of a struct type and the methods of an interface type.
func addMembers(names map[string]bool, typ string, expr ast.Expr) {
	switch expr := expr.(type) {
	case *ast.StructType:
		for _, f := range expr.Fields.List {
			for _, n := range f.Names {
				names[typ+"."+n.Name] = true
			}
			if len(f.Names) == 0 { // embedded: its name is its type's
				t := f.Type
				if star, ok := t.(*ast.StarExpr); ok {
					t = star.X
				}
				switch t := t.(type) {
				case *ast.Ident:
					names[typ+"."+t.Name] = true
				case *ast.SelectorExpr:
					names[typ+"."+t.Sel.Name] = true
				}
			}
		}
	case *ast.InterfaceType:
		for _, m := range expr.Methods.List {
			for _, n := range m.Names {
				names[typ+"."+n.Name] = true
			}
		}
	}
}

// docRef is a qualified name in a comment: pkg.Name or pkg.Type.Member.
var docRef = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// Every exported identifier a comment names as pkg.Name or pkg.Type.Member, where pkg is a
// package of this module, exists: the docs do not cite what a rename or a move left behind.
// (A member of an embedded type, or of a type declared in another package, is not checked.)
func TestDocsNameWhatExists(t *testing.T) {
	pkgs := modulePackages(t)
	// Names that are packages of the module, also by the path a reader writes (elastic/local).
	var stale []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, group := range f.Comments {
			for _, c := range group.List {
				for _, m := range docRef.FindAllStringSubmatch(c.Text, -1) {
					p := pkgs[m[1]]
					if p == nil || m[1] == f.Name.Name && !strings.HasPrefix(filepath.Dir(path), p.dir) {
						continue // not a package of the module (a variable, a field path)
					}
					if !p.names[m[2]] {
						stale = append(stale, fset.Position(c.Pos()).String()+": "+m[0])
						continue
					}
					if m[3] != "" && hasMembers(p.names, m[2]) && !p.names[m[2]+"."+m[3]] {
						stale = append(stale, fset.Position(c.Pos()).String()+": "+m[0])
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(stale)
	if len(stale) > 0 {
		t.Errorf("comments name %d identifiers that do not exist:\n%s", len(stale), strings.Join(stale, "\n"))
	}
	if _, err := os.Stat("go.mod"); err != nil {
		t.Fatal("run from the module's root")
	}
}

// hasMembers reports whether the package records members of typ (a type of the package with
// fields or methods), so that a member it lacks is a stale name rather than one it cannot see.
func hasMembers(names map[string]bool, typ string) bool {
	for n := range names {
		if strings.HasPrefix(n, typ+".") {
			return true
		}
	}
	return false
}
