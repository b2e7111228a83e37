package dedup

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"abc", "abc", ""},
		{`"abc"`, "abc", ""},
		{"  welcome-email:user_6  ", "welcome-email:user_6", ""},
		{`"a\"b\\c"`, `a"b\c`, ""},
		{"a/b?c=d#e", "a/b?c=d#e", ""},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), ""},
		{"", "", "missing"},
		{`""`, "", "empty"},
		{`"abc`, "", "unterminated"},
		{`"ab"c`, "", "after the closing quote"},
		{`"a\b"`, "", "backslash"},
		{`"a b"`, "", "not visible ASCII"},
		{"a\tb", "", "not visible ASCII"},
		{"clé", "", "not visible ASCII"},
		{"a\r\nX-Injected: 1", "", "not visible ASCII"},
		{strings.Repeat("k", 256), "", "at most 255"},
	} {
		got, err := ParseKey(c.in)
		if c.err == "" && (err != nil || got != c.want) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseKey(%q) error %v, want one containing %q", c.in, err, c.err)
		}
	}
}

func TestFingerprintIgnoresKeyOrderAndWhitespaceOnly(t *testing.T) {
	fp := func(typ, payload string) string {
		b, err := Fingerprint(typ, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	a := fp("email", `{"to":["a@x.test"],"subject":"Hi <there>","n":1}`)
	if b := fp("email", "{ \"n\" : 1,\n \"subject\":\"Hi <there>\", \"to\" : [ \"a@x.test\" ] }"); a != b {
		t.Error("key order or whitespace changed the fingerprint")
	}
	for _, other := range []string{
		`{"to":["a@x.test"],"subject":"Hi <there>","n":2}`,
		`{"to":["a@x.test"],"subject":"Hi <there>","n":1.0}`,
		`{"to":["a@x.test"],"subject":"Hi <there>"}`,
	} {
		if fp("email", other) == a {
			t.Errorf("%s has the same fingerprint", other)
		}
	}
	if fp("sms", `{"to":["a@x.test"],"subject":"Hi <there>","n":1}`) == a {
		t.Error("the type is not part of the fingerprint")
	}
	canon, _ := Canonical(map[string]any{"b": 1, "a": []byte(nil), "c": "<&>"})
	if string(canon) != `{"a":null,"b":1,"c":"<&>"}` {
		t.Errorf("canonical form %s", canon)
	}
}
