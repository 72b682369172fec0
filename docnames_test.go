package elasticps_test

import (
	"fmt"
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

// eachGoFile parses every Go file of the module (examples included; test files too with tests)
// with mode, and hands it to f with its path and file set.
func eachGoFile(t *testing.T, tests bool, mode parser.Mode, f func(path string, fset *token.FileSet, file *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || !tests && strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, mode|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		f(path, fset, file)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// modulePackages parses the non-test files of every package of the module (examples included)
// and returns them by package name, and by directory. A name that two packages share maps to
// the first found.
func modulePackages(t *testing.T) (map[string]*docPackage, map[string]*docPackage) {
	t.Helper()
	out := map[string]*docPackage{}
	byDir := map[string]*docPackage{}
	eachGoFile(t, false, 0, func(path string, _ *token.FileSet, f *ast.File) {
		name := f.Name.Name
		p := byDir[filepath.Dir(path)]
		if p == nil {
			p = &docPackage{dir: filepath.Dir(path), names: map[string]bool{}}
			byDir[p.dir] = p
			if out[name] == nil {
				out[name] = p // another package of the same name: the first one stands
			}
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
	})
	return out, byDir
}

// addMembers records the fields of a struct type and the methods of an interface type. A type
// that embeds another gets the members of the embedded type it cannot see: "Type.*".
func addMembers(names map[string]bool, typ string, expr ast.Expr) {
	switch expr := expr.(type) {
	case *ast.StructType:
		for _, f := range expr.Fields.List {
			for _, n := range f.Names {
				names[typ+"."+n.Name] = true
			}
			if len(f.Names) == 0 { // embedded: its name is its type's
				names[typ+".*"] = true
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
			if len(m.Names) == 0 {
				names[typ+".*"] = true // an embedded interface
			}
		}
	}
}

// docRef is a qualified name in a comment: pkg.Name or pkg.Type.Member.
var docRef = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// localRef is a member of a type of the comment's own package: Type.Member, not preceded by a
// qualifier (pkg.Type.Member is docRef's).
var localRef = regexp.MustCompile(`(?:^|[^.\w])([A-Z][A-Za-z0-9_]*)\.([A-Z][A-Za-z0-9_]*)\b`)

// Every exported identifier a comment names as pkg.Name or pkg.Type.Member, where pkg is a
// package of this module, exists: the docs do not cite what a rename or a move left behind.
// (A member of an embedded type, or of a type declared in another package, is not checked.)
func TestDocsNameWhatExists(t *testing.T) {
	pkgs, byDir := modulePackages(t)
	// Names that are packages of the module, also by the path a reader writes (elastic/local).
	var stale []string
	eachGoFile(t, true, parser.ParseComments, func(path string, fset *token.FileSet, f *ast.File) {
		for _, group := range f.Comments {
			for _, c := range group.List {
				// Type.Member of the comment's own package, where the package declares Type with
				// members (a type of another package, named alike, must be qualified).
				own := byDir[filepath.Dir(path)]
				for _, m := range localRef.FindAllStringSubmatch(c.Text, -1) {
					if own != nil && own.names[m[1]] && hasMembers(own.names, m[1]) && !own.names[m[1]+"."+m[2]] {
						stale = append(stale, fset.Position(c.Pos()).String()+": "+m[1]+"."+m[2])
					}
				}
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
	})
	slices.Sort(stale)
	if len(stale) > 0 {
		t.Errorf("comments name %d identifiers that do not exist:\n%s", len(stale), strings.Join(stale, "\n"))
	}
	if _, err := os.Stat("go.mod"); err != nil {
		t.Fatal("run from the module's root")
	}
}

// hasMembers reports whether the package records members of typ (a type of the package with
// fields or methods, none of them embedded), so that a member it lacks is a stale name rather
// than one it cannot see.
func hasMembers(names map[string]bool, typ string) bool {
	if names[typ+".*"] {
		return false
	}
	for n := range names {
		if strings.HasPrefix(n, typ+".") {
			return true
		}
	}
	return false
}

// retiredNames are names that the split of package elastic (and renames since) retired, with
// what replaced them: a comment that still uses one sends its reader to nothing.
var retiredNames = map[string]string{
	"LocalJob":        "local.Job",
	"LocalConfig":     "local.Config",
	"LocalServer":     "server.Server",
	"LocalScaler":     "local.Scaler",
	"LocalRestart":    "local.Job.RestartServerByID",
	"StartLocal":      "local.Start",
	"RemoteServer":    "remote.Server",
	"RemoteServers":   "remote.Server",
	"NewRemoteServer": "remote.NewServer",
	"RemoteControl":   "remote.Control",
	"RemoteConfig":    "remote.Config",
	"ProcessScaler":   "process.Scaler",
}

// No comment, in code or tests, uses a retired name.
func TestDocsUseNoRetiredName(t *testing.T) {
	word := regexp.MustCompile(`\b[A-Z][A-Za-z]+\b`)
	var stale []string
	eachGoFile(t, true, parser.ParseComments, func(path string, fset *token.FileSet, f *ast.File) {
		if path == "docnames_test.go" {
			return // the list above
		}
		for _, g := range f.Comments {
			for _, c := range g.List {
				for _, w := range word.FindAllString(c.Text, -1) {
					if now, ok := retiredNames[w]; ok {
						stale = append(stale, fmt.Sprintf("%s: %s (now %s)", fset.Position(c.Pos()), w, now))
					}
				}
			}
		}
	})
	if len(stale) > 0 {
		t.Errorf("comments use %d retired names:\n%s", len(stale), strings.Join(stale, "\n"))
	}
}
