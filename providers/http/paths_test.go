package http

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/oncegate/oncegate/providers"
)

// Two more spellings of a dot segment that upstreams read as one: a segment whose part before ";" is . or ..
// (Tomcat and Spring drop the path parameter, so "..;" is ".."), and a backslash, raw or %5C, which IIS and
// others read as "/". Each is refused at request time, naming payload.path, and reaches no upstream.
func TestMatrixAndBackslashDotSegmentsAreRefused(t *testing.T) {
	t.Parallel()
	d := newDest(t).(dest)
	for _, path := range []string{"/..;/admin", "/a/..;x/b", "/.;x/a", "/..;", "/%2e%2e;/x", "/..%3B/x",
		`/..\x`, `/a\..\..\x`, "/..%5Cx", "/a%5c..%5c..%5cx", `/a\b`, "/a%5Cb"} {
		raw := json.RawMessage(`{"method":"GET","path":` + strconv.Quote(path) + `}`)
		err := d.p.Validate(raw)
		var fe *providers.FieldError
		if !errors.As(err, &fe) || fe.Field != "payload.path" {
			t.Errorf("path %q: %v, want refused naming path", path, err)
			continue
		}
		if o := d.p.Deliver(context.Background(), delivery("k-"+path, string(raw))); o.Kind != providers.KindFailed {
			t.Errorf("path %q delivered: %v", path, o.Kind)
		}
	}
	d.mu.Lock()
	reached := d.last
	d.mu.Unlock()
	if reached != nil {
		t.Fatalf("a refused path reached the upstream: %s", reached.URL)
	}
	// A semicolon or dots elsewhere are ordinary.
	for _, path := range []string{"/a;v=1/b", "/a..;/b", "/...;/b", "/a/b;..", "/x?path=..;/y", `/x?q=a\b`} {
		if err := d.p.Validate(json.RawMessage(`{"method":"GET","path":` + strconv.Quote(path) + `}`)); err != nil {
			t.Errorf("path %q refused: %v", path, err)
		}
	}
}

// SPEC §7: a body is a string, sent as it is, or any other JSON value, sent as JSON. null is a JSON value:
// it is sent as "null" with Content-Type application/json, not as no body at all. No body is no body.
func TestNullBodyIsSentAsJSON(t *testing.T) {
	t.Parallel()
	d := newDest(t).(dest)
	o := d.p.Deliver(context.Background(), delivery("null", `{"method":"POST","path":"/n","body":null}`))
	if o.Kind != providers.KindDelivered || string(d.lastBody) != "null" || d.last.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("null body: %v %q %v", o.Kind, d.lastBody, d.last.Header)
	}
	o = d.p.Deliver(context.Background(), delivery("none", `{"method":"POST","path":"/n"}`))
	if o.Kind != providers.KindDelivered || len(d.lastBody) != 0 || d.last.Header.Get("Content-Type") != "" {
		t.Fatalf("no body: %v %q %v", o.Kind, d.lastBody, d.last.Header)
	}
}
