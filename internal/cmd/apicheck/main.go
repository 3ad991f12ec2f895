// Command apicheck checks that rdmago has one API everywhere: every public
// package exports the same API with cgo on Linux, without cgo on Linux and
// without cgo on darwin (what needs libibverbs or librdmacm returns an error
// matching ErrNoCgo instead of vanishing), that API never mentions unsafe or a
// cgo type, and every package, example and test builds and vets in each of
// those configurations.
//
// Run it from the module's root (make api does):
//
//	go run ./internal/cmd/apicheck        # check; exit status 1 on any finding
//	go run ./internal/cmd/apicheck -list  # also print each configuration's API
//
// The API comes from the compiler's own export data (go list -export, which
// shares the build cache with go build and go vet), read with go/importer, so
// it is exactly what a user's code compiles against: cgo's renamed C types
// (_Ctype_...) show as such, constants have their values, and methods promoted
// through embedded fields are included. Parameter names and doc comments are
// not part of it. Only the standard library is needed.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

// A config is one build configuration whose API must equal the reference's.
type config struct {
	name string
	env  []string
	// skip lists import-path prefixes this configuration neither builds
	// nor checks, each with the reason.
	skip map[string]string
	// build says whether apicheck runs go build and go vet here (lint does
	// it for the host's own cgo build).
	build bool
}

const module = "github.com/rdmago/rdmago"

var configs = []config{
	// The reference: the build that has libibverbs and librdmacm.
	{name: "linux/cgo", env: []string{"GOOS=linux", "CGO_ENABLED=1"}},
	{name: "linux/nocgo", env: []string{"GOOS=linux", "CGO_ENABLED=0"}, build: true},
	// Every package builds on darwin too, the test bed included, though
	// only a Linux host can boot its guests.
	{name: "darwin/nocgo", env: []string{"GOOS=darwin", "CGO_ENABLED=0"}, build: true},
}

func main() {
	list := flag.Bool("list", false, "print every configuration's API")
	flag.Parse()
	failed, err := run(os.Stdout, *list)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(2)
	}
	if failed {
		fmt.Println("apicheck: FAIL (see above)")
		os.Exit(1)
	}
	fmt.Println("apicheck: ok: one API in", configNames(), "and everything builds")
}

func configNames() string {
	var names []string
	for _, c := range configs {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

func run(out io.Writer, list bool) (failed bool, err error) {
	all, err := goList(nil, "-e", "-f", "{{.ImportPath}} {{.Name}}", "./...")
	if err != nil {
		return false, err
	}
	pkgs := publicPackages(all)
	apis := make([]map[string][]string, len(configs)) // per config: package -> API lines
	for i, c := range configs {
		if c.build {
			if !buildAndVet(out, c) {
				failed = true
			}
		}
		var want []string
		for _, p := range pkgs {
			if skipped(c, p) == "" {
				want = append(want, p)
			}
		}
		var problems []string
		apis[i], problems, err = exportedAPIs(c, want)
		if err != nil {
			return false, err
		}
		for _, p := range problems {
			fmt.Fprintf(out, "%s: %s\n", c.name, p)
			failed = true
		}
		if list {
			for _, p := range want {
				fmt.Fprintf(out, "== API of %s in %s\n", p, c.name)
				for _, l := range apis[i][p] {
					fmt.Fprintf(out, "\t%s\n", l)
				}
			}
		}
	}
	for _, p := range pkgs {
		ref := apis[0][p]
		for _, l := range forbidden(ref) {
			fmt.Fprintf(out, "%s: %s: API mentions unsafe or a cgo type: %s\n", configs[0].name, short(p), l)
			failed = true
		}
		for i := 1; i < len(configs); i++ {
			got, ok := apis[i][p]
			if !ok {
				continue // skipped, or reported as not loading
			}
			for _, l := range forbidden(got) {
				fmt.Fprintf(out, "%s: %s: API mentions unsafe or a cgo type: %s\n", configs[i].name, short(p), l)
				failed = true
			}
			if _, ok := apis[0][p]; !ok {
				continue
			}
			missing, extra := diff(ref, got)
			for _, l := range missing {
				fmt.Fprintf(out, "%s: %s: lacks (%s has): %s\n", configs[i].name, short(p), configs[0].name, l)
			}
			for _, l := range extra {
				fmt.Fprintf(out, "%s: %s: adds (%s lacks): %s\n", configs[i].name, short(p), configs[0].name, l)
			}
			if len(missing)+len(extra) > 0 {
				failed = true
			}
		}
	}
	return failed, nil
}

// publicPackages are the module's importable library packages: not commands,
// not under an internal directory.
func publicPackages(listing []byte) []string {
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(listing)), "\n") {
		path, name, _ := strings.Cut(line, " ")
		if name == "main" || strings.Contains(path+"/", "/internal/") {
			continue
		}
		pkgs = append(pkgs, path)
	}
	return pkgs
}

func skipped(c config, pkg string) string {
	for prefix, why := range c.skip {
		if pkg == prefix || strings.HasPrefix(pkg, prefix+"/") {
			return why
		}
	}
	return ""
}

func short(pkg string) string { return strings.TrimPrefix(pkg, module+"/") }

// buildAndVet builds and vets every package of the module (commands, tests)
// in c, but those c skips. It reports failures to out.
func buildAndVet(out io.Writer, c config) bool {
	// Only packages with files for c: ./... leaves the others out itself,
	// an explicit list would not.
	// go build needs package files; go vet also takes a package that has
	// only test files for c.
	listing, err := goList(c.env, "-e", "-f", "{{.ImportPath}} {{len .GoFiles}}{{len .CgoFiles}} {{len .TestGoFiles}}{{len .XTestGoFiles}}", "./...")
	if err != nil {
		fmt.Fprintf(out, "%s: go list: %v\n", c.name, err)
		return false
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(listing)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || skipped(c, f[0]) != "" {
			continue
		}
		if strings.Trim(f[1], "0") != "" {
			pkgs["build"] = append(pkgs["build"], f[0])
		}
		if strings.Trim(f[1]+f[2], "0") != "" {
			pkgs["vet"] = append(pkgs["vet"], f[0])
		}
	}
	ok := true
	for _, verb := range []string{"build", "vet"} {
		cmd := exec.Command("go", append([]string{verb}, pkgs[verb]...)...)
		cmd.Env = append(os.Environ(), c.env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(out, "%s: go %s failed:\n%s", c.name, verb, indent(b))
			ok = false
		}
	}
	return ok
}

func indent(b []byte) string {
	var s strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l != "" {
			s.WriteString("\t" + l)
		}
	}
	if !strings.HasSuffix(s.String(), "\n") {
		s.WriteString("\n")
	}
	return s.String()
}

func goList(env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return b, fmt.Errorf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return b, nil
}

// exportedAPIs compiles pkgs (and their dependencies) in c and returns each
// package's API. A package that does not compile is a problem, not an error.
func exportedAPIs(c config, pkgs []string) (map[string][]string, []string, error) {
	apis := map[string][]string{}
	if len(pkgs) == 0 {
		return apis, nil, nil
	}
	// go list -e exits non-zero when a package does not compile, and still
	// describes every package.
	listing, _ := goList(c.env, append([]string{"-e", "-export", "-deps", "-json=ImportPath,Export,Error,DepsErrors"}, pkgs...)...)
	type pkgErr struct{ Err string }
	exports := map[string]string{}
	errs := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(listing))
	for {
		var p struct {
			ImportPath string
			Export     string
			Error      *pkgErr
			DepsErrors []*pkgErr
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("%s: go list -export: %v", c.name, err)
		}
		exports[p.ImportPath] = p.Export
		var msgs []string
		if p.Error != nil {
			msgs = append(msgs, p.Error.Err)
		}
		for _, e := range p.DepsErrors {
			msgs = append(msgs, e.Err)
		}
		errs[p.ImportPath] = strings.Join(msgs, "; ")
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if exports[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(exports[path])
	})
	var problems []string
	for _, p := range pkgs {
		if exports[p] == "" {
			why := errs[p]
			if why == "" {
				why = "it does not compile (see go build)"
			}
			problems = append(problems, fmt.Sprintf("%s: cannot read its API: %s", short(p), why))
			continue
		}
		tp, err := imp.Import(p)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: cannot read its API: %v", short(p), err))
			continue
		}
		apis[p] = API(tp)
	}
	return apis, problems, nil
}

// API returns pkg's exported API, one sorted line per const, var, func, type,
// exported struct field, interface method and method in a method set.
// Parameter names are left out: they are not part of the API.
func API(pkg *types.Package) []string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Path()
	}
	str := func(t types.Type) string { return types.TypeString(t, qual) }
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", name, str(o.Type()), o.Val().ExactString())
		case *types.Var:
			add("var %s %s", name, str(o.Type()))
		case *types.Func:
			add("func %s%s", name, strings.TrimPrefix(str(unnamed(o.Type().(*types.Signature))), "func"))
		case *types.TypeName:
			if o.IsAlias() {
				add("type %s = %s", name, str(types.Unalias(o.Type())))
				continue
			}
			named, ok := o.Type().(*types.Named)
			if !ok {
				add("type %s %s", name, str(o.Type()))
				continue
			}
			decl := name + typeParams(named.TypeParams(), str)
			switch u := named.Underlying().(type) {
			case *types.Struct:
				// Comparability is API: == and map keys compile or not.
				add("type %s struct%s", decl, comparable(named))
				for i := 0; i < u.NumFields(); i++ {
					f := u.Field(i)
					if !f.Exported() {
						continue
					}
					kind := "field"
					if f.Embedded() {
						kind = "embedded"
					}
					tag := ""
					if u.Tag(i) != "" {
						tag = " `" + u.Tag(i) + "`"
					}
					add("%s %s.%s %s%s", kind, name, f.Name(), str(f.Type()), tag)
				}
			case *types.Interface:
				add("type %s interface", decl)
				// Unexported methods count too: they decide who can
				// implement it.
				for i := 0; i < u.NumMethods(); i++ {
					m := u.Method(i)
					add("method %s.%s%s", name, m.Name(), strings.TrimPrefix(str(unnamed(m.Type().(*types.Signature))), "func"))
				}
				if !u.IsMethodSet() {
					add("constraint %s %s", name, str(u))
				}
				continue
			default:
				add("type %s %s%s", decl, str(u), comparable(named))
			}
			// Methods, promoted ones included, on T or only on *T.
			values := types.NewMethodSet(named)
			ptrs := types.NewMethodSet(types.NewPointer(named))
			for i := 0; i < ptrs.Len(); i++ {
				m := ptrs.At(i).Obj()
				if !m.Exported() {
					continue
				}
				recv := "*" + name
				if values.Lookup(m.Pkg(), m.Name()) != nil {
					recv = name
				}
				add("method (%s) %s%s", recv, m.Name(), strings.TrimPrefix(str(unnamed(m.Type().(*types.Signature))), "func"))
			}
		}
	}
	slices.Sort(lines)
	return lines
}

func comparable(t types.Type) string {
	if types.Comparable(t) {
		return ""
	}
	return " (not comparable)"
}

func typeParams(tps *types.TypeParamList, str func(types.Type) string) string {
	if tps.Len() == 0 {
		return ""
	}
	var s []string
	for i := 0; i < tps.Len(); i++ {
		s = append(s, tps.At(i).Obj().Name()+" "+str(tps.At(i).Constraint()))
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// unnamed returns sig without its receiver and parameter names.
func unnamed(sig *types.Signature) *types.Signature {
	strip := func(t *types.Tuple) *types.Tuple {
		var vs []*types.Var
		for i := 0; i < t.Len(); i++ {
			vs = append(vs, types.NewParam(token.NoPos, nil, "", t.At(i).Type()))
		}
		return types.NewTuple(vs...)
	}
	var tps []*types.TypeParam
	for i := 0; i < sig.TypeParams().Len(); i++ {
		tps = append(tps, sig.TypeParams().At(i))
	}
	return types.NewSignatureType(nil, nil, tps, strip(sig.Params()), strip(sig.Results()), sig.Variadic())
}

// cgoOrUnsafe matches what the API must not mention: package unsafe, and the
// names cgo gives C's types, functions and variables in Go.
var cgoOrUnsafe = regexp.MustCompile(`\bunsafe\.|\b_C(type|func|var|macro|2func)?_|\b_cgo_`)

func forbidden(api []string) []string {
	var bad []string
	for _, l := range api {
		if cgoOrUnsafe.MatchString(l) {
			bad = append(bad, l)
		}
	}
	return bad
}

// diff returns the lines only in want (missing from got) and only in got;
// both are sorted.
func diff(want, got []string) (missing, extra []string) {
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || i < len(want) && want[i] < got[j]:
			missing = append(missing, want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			extra = append(extra, got[j])
			j++
		default:
			i++
			j++
		}
	}
	return missing, extra
}
