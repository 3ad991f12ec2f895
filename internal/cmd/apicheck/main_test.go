package main

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"testing"
)

// check type-checks one file as package p (imports: unsafe only).
func check(t *testing.T, src string) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: importer.Default()}
	pkg, err := conf.Check("example.com/p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}

// The cgo build of a package, as the compiler sees it after cgo: C types are
// renamed _Ctype_..., and it leaks unsafe.
const withCgo = `package p

import "unsafe"

type _Ctype_struct_ibv_cq struct{ x int }

type Kind uint8

const (
	KindA Kind = iota
	KindB
)

type Base struct{}

func (Base) Name() string { return "" }

type Conn struct {
	Base
	QPN  uint32 ` + "`json:\"qpn\"`" + `
	cq   *_Ctype_struct_ibv_cq
	bufs [][]byte
}

func (c *Conn) Send(buf []byte, n int) error { return nil }
func (c *Conn) CQ() *_Ctype_struct_ibv_cq { return c.cq }
func Borrow(p unsafe.Pointer) *Conn        { return nil }

type Handler interface {
	Handle(c *Conn) error
	private()
}
`

// Its stub, with what is missing or different.
const withoutCgo = `package p

type Kind uint8

const (
	KindA Kind = iota
	KindB
	KindC
)

type Base struct{}

func (Base) Name() string { return "" }

type Conn struct {
	Base
}

func (c *Conn) Send(data []byte, count int) error { return nil }

type Handler interface {
	Handle(c *Conn) error
	private()
}
`

func TestAPI(t *testing.T) {
	got := API(check(t, withCgo))
	want := []string{
		"const KindA Kind = 0",
		"const KindB Kind = 1",
		"embedded Conn.Base Base",
		"field Conn.QPN uint32 `json:\"qpn\"`",
		"func Borrow(unsafe.Pointer) *Conn",
		"method (*Conn) CQ() *_Ctype_struct_ibv_cq",
		"method (*Conn) Send([]byte, int) error",
		"method (Base) Name() string",
		"method (Conn) Name() string", // promoted from Base
		"method Handler.Handle(*Conn) error",
		"method Handler.private()",
		"type Base struct",
		"type Conn struct (not comparable)",
		"type Handler interface",
		"type Kind uint8",
	}
	if !slices.Equal(got, want) {
		t.Errorf("API:\n%q\nwant\n%q", got, want)
	}
	bad := forbidden(got)
	wantBad := []string{"func Borrow(unsafe.Pointer) *Conn", "method (*Conn) CQ() *_Ctype_struct_ibv_cq"}
	if !slices.Equal(bad, wantBad) {
		t.Errorf("forbidden: %q, want %q", bad, wantBad)
	}
}

func TestDiff(t *testing.T) {
	missing, extra := diff(API(check(t, withCgo)), API(check(t, withoutCgo)))
	wantMissing := []string{
		"field Conn.QPN uint32 `json:\"qpn\"`",
		"func Borrow(unsafe.Pointer) *Conn",
		"method (*Conn) CQ() *_Ctype_struct_ibv_cq",
		"type Conn struct (not comparable)",
	}
	wantExtra := []string{
		"const KindC Kind = 2",
		"type Conn struct",
	}
	if !slices.Equal(missing, wantMissing) {
		t.Errorf("missing: %q, want %q", missing, wantMissing)
	}
	if !slices.Equal(extra, wantExtra) {
		t.Errorf("extra: %q, want %q", extra, wantExtra)
	}
}

func TestPublicPackages(t *testing.T) {
	got := publicPackages([]byte(`github.com/rdmago/rdmago/bench main
github.com/rdmago/rdmago/examples/internal/interop interop
github.com/rdmago/rdmago/internal/fdwait fdwait
github.com/rdmago/rdmago/rdmacm rdmacm
github.com/rdmago/rdmago/test/testbed testbed
github.com/rdmago/rdmago/test/testbed/internal/agent agent
github.com/rdmago/rdmago/verbs verbs
`))
	want := []string{"github.com/rdmago/rdmago/rdmacm", "github.com/rdmago/rdmago/test/testbed", "github.com/rdmago/rdmago/verbs"}
	if !slices.Equal(got, want) {
		t.Errorf("publicPackages: %q, want %q", got, want)
	}
}
