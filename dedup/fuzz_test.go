package dedup

import (
	"encoding/json"
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
