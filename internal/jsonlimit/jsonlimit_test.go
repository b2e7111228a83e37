package jsonlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	members := func(n int, extra string) string { // an object of n distinct members, then extra
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, `"m%d":%d,`, i, i)
		}
		return b.String() + extra + "}"
	}
	cases := []struct {
		name, doc, path string // path "" with ok: accepted
		ok              bool
		syntax          bool
	}{
		{name: "object", doc: `{"to":["a@example.com"],"n":1.5,"b":true,"z":null}`, ok: true},
		{name: "empty member name", doc: `{"":1,"a":{"":2}}`, ok: true},
		{name: "scalar root", doc: `42`, ok: true},
		{name: "64 levels", doc: deep(64), ok: true},
		{name: "65 levels", doc: deep(65), path: strings.Repeat("[0]", 64)},
		{name: "deep in an object", doc: `{"a":` + deep(64) + `}`, path: "a" + strings.Repeat("[0]", 63)},
		{name: "huge exponent", doc: `{"a":[1,1e131071]}`, path: "a[1]"},
		{name: "tiny exponent", doc: `{"a":1e-16383}`, path: "a"},
		{name: "double overflow", doc: `{"a":1.8e308}`, path: "a"},
		{name: "double max", doc: `{"a":1.7976931348623157e308}`, ok: true},
		{name: "smallest subnormal", doc: `{"a":5e-324}`, ok: true},
		{name: "zero with huge exponent", doc: `{"a":0e99999}`, path: "a"},
		{name: "zero", doc: `{"a":0.0e0,"b":-0}`, ok: true},
		{name: "40 digits", doc: `[` + strings.Repeat("1", 40) + `]`, ok: true},
		{name: "41 digits", doc: `[` + strings.Repeat("1", 41) + `]`, path: "[0]"},
		{name: "duplicate", doc: `{"name":"a","name":"b"}`, path: "name"},
		{name: "case-variant duplicate", doc: `{"name":"a","NAME":"b"}`, path: "NAME"},
		{name: "nested duplicate", doc: `{"to":[{"x":1},{"x":1,"X":2}]}`, path: "to[1].X"},
		{name: "same name in sibling objects", doc: `[{"a":1},{"a":1}]`, ok: true},
		{name: "not JSON", doc: `{"a":}`, syntax: true},
		{name: "truncated", doc: `{"a":[1,2`, syntax: true},
		{name: "two values", doc: `{} {}`, syntax: true},
		{name: "empty", doc: ``, syntax: true},
		{name: "lone high surrogate", doc: `{"s":"\ud800"}`, path: "s"},
		{name: "lone low surrogate", doc: `{"a":["x\udc00y"]}`, path: "a[0]"},
		{name: "high then not low", doc: `{"s":"\ud800\u0041"}`, path: "s"},
		{name: "two highs", doc: `{"s":"\ud800\ud800\udc00"}`, path: "s"},
		{name: "surrogate in a name", doc: `{"\udfff":1}`, path: "\ufffd"},
		{name: "a pair", doc: `{"s":"\ud83d\ude00 \u00e9"}`, ok: true},
		{name: "escaped duplicate", doc: `{"a\u0062":1,"ab":2}`, path: "ab"},
		{name: "large object", doc: members(30000, `"last":1`), ok: true},
		{name: "large object, duplicate at the end", doc: members(30000, `"M7":1`), path: "M7"},
		{name: "duplicate across the switch to a map", doc: `{"a":1,` + members(20, `"A":2`)[1:], path: "A"},
		{name: "large object, escaped duplicate", doc: members(40, `"\u006d39":1`), path: "m39"},
		{name: "whitespace everywhere", doc: " { \"a\" : [ 1 , { } ] , \"b\" : \"x\\\"y\" } ", ok: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Check([]byte(c.doc), Limits{})
			var le *Error
			switch {
			case c.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case c.syntax:
				if !errors.Is(err, ErrSyntax) {
					t.Fatalf("got %v, want ErrSyntax", err)
				}
			case !c.ok && !errors.As(err, &le):
				t.Fatalf("got %v, want *Error at %q", err, c.path)
			case !c.ok && le.Path != c.path:
				t.Fatalf("refused at %q (%s), want %q", le.Path, le.Reason, c.path)
			}
		})
	}
}

// FuzzCheck: Check never panics, refuses whatever is not JSON, and what it accepts decodes without error and
// holds only finite numbers.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}]}`, `1e999`, `{"a":1,"A":2}`, `[[[[]]]]`, `"x"`, `{"":0}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		err := Check(doc, Limits{MaxDepth: 8})
		if err != nil {
			return
		}
		dec := json.NewDecoder(strings.NewReader(string(doc)))
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("accepted %q, which does not decode: %v", doc, err)
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	doc := []byte(`{"to":["a@example.com","b@example.com"],"subject":"Welcome","body":"` + strings.Repeat("x", 800) +
		`","meta":{"n":12345,"tags":["a","b","c"],"score":0.25}}`)
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		if err := Check(doc, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
