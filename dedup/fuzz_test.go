package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// The Idempotency-Key parser never panics, and what it accepts is a key the API promises: 1-255 visible
// ASCII characters. A bare key that it accepts parses to itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"`, `""`, "a b", "\x00", "k\r\nX: y", strings.Repeat("k", 256), `"\\"`, "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := ParseKey(in)
		if err != nil {
			return
		}
		if len(key) < 1 || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d", in, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %d is not visible ASCII", in, key, i)
			}
		}
		if trimmed := strings.TrimSpace(in); !strings.HasPrefix(trimmed, `"`) && key != trimmed {
			t.Fatalf("bare key %q parsed to %q", in, key)
		}
	})
}

// The fingerprint of any JSON value is stable under re-encoding: a payload and its canonical form have the
// same fingerprint, and canonicalising twice changes nothing.
func FuzzFingerprintIsCanonical(f *testing.F) {
	for _, s := range []string{`{}`, `{"b":1,"a":[true,null,"x"]}`, `{"n":1.50,"s":"<&>"}`, `{"deep":{"a":{"b":{"c":[1,[2,[3]]]}}}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if !json.Valid([]byte(in)) || !utf8.ValidString(in) {
			return
		}
		c1, err := Canonical(json.RawMessage(in))
		if err != nil {
			return
		}
		c2, err := Canonical(json.RawMessage(c1))
		if err != nil || string(c1) != string(c2) {
			t.Fatalf("canonical form not stable: %s then %s (%v)", c1, c2, err)
		}
		a, err1 := Fingerprint("t", json.RawMessage(in))
		b, err2 := Fingerprint("t", json.RawMessage(c1))
		if err1 != nil || err2 != nil || string(a) != string(b) {
			t.Fatalf("fingerprints differ for %s and its canonical form", in)
		}
	})
}

// The fingerprint sees a payload's content, not how it is written: the same members in any order, at any
// depth, with any whitespace and escaping, give one fingerprint; and any change of content (a value, a member
// added, an element added, the effect type) gives another. Each input is a JSON document and a seed that
// shuffles its objects' members and picks the change.
func FuzzFingerprintKeyOrder(f *testing.F) {
	for i, s := range []string{
		`{"a":1,"b":2}`,
		`{"z":{"y":[{"b":true,"a":null},{"d":"x","c":1.50}],"x":{}},"a":[[],{}],"m":"\u00e9\/"}`,
		`{"amount":100,"currency":"EUR","customer":{"id":"c_1","email":"a@b.test","tags":["x","y"]},"meta":{"b":{"c":{"d":{"e":1}}},"a":0}}`,
		`[{"b":1,"a":2},{"d":{"f":1,"e":2},"c":3}]`,
		`{"\u00e9":1,"e":2,"é\u0301":3,"":4,"A":5,"a":6}`,
		`{"n":-0,"m":1e400,"k":12345678901234567890.5,"j":"<&>"}`,
		`"just a string"`, `42`, `null`, `[]`, `{}`,
	} {
		f.Add(s, uint64(i)*0x9e3779b97f4a7c15)
	}
	f.Fuzz(func(t *testing.T, in string, seed uint64) {
		if !json.Valid([]byte(in)) || !utf8.ValidString(in) {
			return
		}
		doc, err := parseOrdered(in)
		if err != nil {
			return // duplicate keys: which one wins depends on order, so order may rightly matter
		}
		want, err := Fingerprint("t", json.RawMessage(in))
		if err != nil {
			return
		}
		rng := rand.New(rand.NewPCG(seed, ^seed))
		var permuted bytes.Buffer
		doc.write(&permuted, rng)
		got, err := Fingerprint("t", permuted.Bytes())
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("fingerprints differ (%v) for %s and the same members reordered: %s", err, in, permuted.Bytes())
		}

		changed := doc.mutate(rng)
		var other bytes.Buffer
		changed.write(&other, rng)
		got, err = Fingerprint("t", other.Bytes())
		if err != nil || bytes.Equal(got, want) {
			t.Fatalf("one fingerprint (%v) for %s and the changed %s", err, in, other.Bytes())
		}
		if got, err = Fingerprint("u", json.RawMessage(in)); err != nil || bytes.Equal(got, want) {
			t.Fatalf("one fingerprint (%v) for %s as two effect types", err, in)
		}
	})
}

// jsonNode is a JSON value that keeps its objects' member order, which encoding/json's maps lose.
type jsonNode struct {
	kind   json.Delim // '{' or '[' for containers, 0 for a scalar (the zero value is null)
	keys   []string   // an object's member names, in document order
	kids   []jsonNode // an object's member values or an array's elements
	scalar any        // string, json.Number, bool or nil
}

var errDuplicateKey = errors.New("duplicate key")

func parseOrdered(in string) (jsonNode, error) {
	dec := json.NewDecoder(strings.NewReader(in))
	dec.UseNumber()
	n, err := parseNode(dec)
	if err != nil {
		return n, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return n, errors.New("trailing data")
	}
	return n, nil
}

func parseNode(dec *json.Decoder) (jsonNode, error) {
	tok, err := dec.Token()
	if err != nil {
		return jsonNode{}, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return jsonNode{scalar: tok}, nil
	}
	n := jsonNode{kind: d}
	seen := map[string]bool{}
	for dec.More() {
		if d == '{' {
			k, err := dec.Token()
			if err != nil {
				return n, err
			}
			key := k.(string)
			if seen[key] {
				return n, errDuplicateKey
			}
			seen[key] = true
			n.keys = append(n.keys, key)
		}
		kid, err := parseNode(dec)
		if err != nil {
			return n, err
		}
		n.kids = append(n.kids, kid)
	}
	_, err = dec.Token() // the closing delimiter
	return n, err
}

// write encodes n with its objects' members in an order drawn from rng, and some whitespace between tokens.
func (n jsonNode) write(b *bytes.Buffer, rng *rand.Rand) {
	space := func() { b.WriteString([]string{"", "", " ", "\n\t"}[rng.IntN(4)]) }
	enc := func(v any) {
		e := json.NewEncoder(b)
		e.SetEscapeHTML(rng.IntN(2) == 0) // escaped or not, "<" is one character
		_ = e.Encode(v)
		b.Truncate(b.Len() - 1) // Encode's newline
	}
	switch n.kind {
	case 0:
		enc(n.scalar)
	case '[':
		b.WriteByte('[')
		for i, kid := range n.kids {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			kid.write(b, rng)
		}
		b.WriteByte(']')
	case '{':
		b.WriteByte('{')
		for i, j := range rng.Perm(len(n.kids)) {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			enc(n.keys[j])
			b.WriteByte(':')
			space()
			n.kids[j].write(b, rng)
		}
		b.WriteByte('}')
	}
}

// mutate returns a copy of n whose content differs in one place drawn from rng: a scalar replaced by a
// different one, a member added to an object, or an element added to an array.
func (n jsonNode) mutate(rng *rand.Rand) jsonNode {
	var sites []*jsonNode
	root := n.clone()
	var walk func(*jsonNode)
	walk = func(x *jsonNode) {
		sites = append(sites, x)
		for i := range x.kids {
			walk(&x.kids[i])
		}
	}
	walk(&root)
	x := sites[rng.IntN(len(sites))]
	switch x.kind {
	case 0:
		switch v := x.scalar.(type) {
		case string:
			x.scalar = v + "x"
		case bool:
			x.scalar = !v
		case json.Number:
			x.scalar = string(v) // a string is never equal to a number
		default: // null
			x.scalar = json.Number("0")
		}
	case '[':
		x.kids = append(x.kids, jsonNode{})
	case '{':
		key := "new"
		for slices.Contains(x.keys, key) {
			key += "~"
		}
		x.keys = append(x.keys, key)
		x.kids = append(x.kids, jsonNode{})
	}
	return root
}

func (n jsonNode) clone() jsonNode {
	c := n
	c.keys = append([]string(nil), n.keys...)
	c.kids = make([]jsonNode, len(n.kids))
	for i, kid := range n.kids {
		c.kids[i] = kid.clone()
	}
	return c
}

// Fingerprint decodes a payload once, where it used to encode the envelope and decode it whole again: the
// fingerprints of effects stored before must not change, or their retries would be refused as another
// request (422). It agrees with that reference on every input, refusals included, and on types that are not
// valid UTF-8.
func FuzzFingerprintMatchesTheEnvelopeRoundTrip(f *testing.F) {
	for _, s := range []string{`{}`, `null`, ``, ` `, `{} x`, `{}{}`, `{"a":1,"a":2}`, `{"\u0061":"\ud800"}`,
		`{"s":"\u2028<&>\u0000\b\f"}`, `[1.0, 1e3, -0, 12345678901234567890]`, "{\"k\":\"\xff\"}", ` {"b":[{"z":1,"y":2}]} `,
		`{"a":}`, `"str"`} {
		f.Add(s, "t")
	}
	f.Add(`{}`, "\xff<t>")
	f.Fuzz(func(t *testing.T, payload, typ string) {
		want, wantErr := Canonical(map[string]any{"type": typ, "payload": json.RawMessage(payload)})
		got, err := Fingerprint(typ, json.RawMessage(payload))
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("Fingerprint(%q, %q): error %v, the round trip's %v", typ, payload, err, wantErr)
		}
		if err != nil {
			return
		}
		sum := sha256.Sum256(want)
		if !bytes.Equal(got, sum[:]) {
			t.Fatalf("Fingerprint(%q, %q) differs from the round trip's (%s)", typ, payload, want)
		}
	})
}
