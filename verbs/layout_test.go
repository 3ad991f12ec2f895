package verbs

import (
	"reflect"
	"testing"

	"github.com/rdmago/rdmago/internal/ibv"
)

// CQ.Poll hands the caller's []WorkCompletion to internal/ibv as []ibv.WC,
// which C fills: the two must agree field for field.
func TestWorkCompletionLayout(t *testing.T) {
	ours, theirs := reflect.TypeOf(WorkCompletion{}), reflect.TypeOf(ibv.WC{})
	if ours.Size() != theirs.Size() || ours.NumField() != theirs.NumField() {
		t.Fatalf("WorkCompletion is %d bytes in %d fields, ibv.WC %d in %d", ours.Size(), ours.NumField(), theirs.Size(), theirs.NumField())
	}
	for i := range ours.NumField() {
		a, b := ours.Field(i), theirs.Field(i)
		if a.Name != b.Name || a.Offset != b.Offset || a.Type.Kind() != b.Type.Kind() || a.Type.Size() != b.Type.Size() {
			t.Errorf("field %d: WorkCompletion.%s (%v at %d) vs ibv.WC.%s (%v at %d)", i, a.Name, a.Type, a.Offset, b.Name, b.Type, b.Offset)
		}
	}
}

// SGEs are copied by conversion, which needs identical fields.
func TestSGEMatchesIBV(t *testing.T) {
	s := SGE{Addr: 1, Length: 2, LKey: 3}
	if got := ibv.SGE(s); got.Addr != 1 || got.Length != 2 || got.LKey != 3 {
		t.Fatalf("ibv.SGE(%+v) = %+v", s, got)
	}
}

// fill sets every field of v to a distinct non-zero value.
func fill(v reflect.Value, n *uint64) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), n)
		}
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), n)
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		*n++
		v.SetInt(int64(*n % 100))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		*n++
		v.SetUint(*n % 200)
	}
}

// Every field of QPAttr and AHAttr survives the conversion to internal/ibv's
// plain types and back (internal/ibv's test covers C's side of the layouts).
func TestQPAttrRoundTrip(t *testing.T) {
	var a QPAttr
	var n uint64
	fill(reflect.ValueOf(&a).Elem(), &n)
	c := attrToIBV(&a)
	if got := attrFromIBV(&c); got != a {
		t.Fatalf("round trip changed the attributes:\n got %+v\nwant %+v", got, a)
	}
	w := WorkCompletion{}
	fill(reflect.ValueOf(&w).Elem(), &n)
	if got := *wcToIBV(&w); got != *(*ibv.WC)(reflect.ValueOf(&w).UnsafePointer()) {
		t.Fatalf("wcToIBV(%+v) = %+v", w, got)
	}
}
