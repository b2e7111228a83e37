package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/providers"
)

func urlPayload(u string) json.RawMessage {
	return json.RawMessage(`{"event":"e","data":1,"url":` + strconv.Quote(u) + `}`)
}

// Finding 6 of issue 13: an allowed_hosts entry named a host only, so a payload url could downgrade to http or
// pick any port on it, and the answer came back in result.body. An entry pins the scheme and port too: a bare
// host means https on 443, and anything else is spelled out.
func TestAllowedHostsPinSchemeAndPort(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Secret: secretA, AllowedHosts: []string{
		"hooks.example.com", "*.apps.example.com", "api.example.com:8443", "http://legacy.example.com:8080",
		"https://secure.example.com", "HTTPS://Upper.Example.com/", "[2606:4700::1111]:8443", "http://127.0.0.1:*",
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{
		"https://hooks.example.com/x", "https://hooks.example.com:443/x?y=1", "https://HOOKS.example.com/x",
		"https://a.apps.example.com/", "https://deep.a.apps.example.com/", "https://api.example.com:8443/",
		"http://legacy.example.com:8080/x", "https://secure.example.com/", "https://upper.example.com/",
		"https://[2606:4700:0:0::1111]:8443/", "http://127.0.0.1:5555/", "http://127.0.0.1:80/",
	} {
		if err := p.Validate(urlPayload(u)); err != nil {
			t.Errorf("%s refused: %v", u, err)
		}
	}
	for _, u := range []string{
		"http://hooks.example.com/x",      // the downgrade
		"http://hooks.example.com:443/x",  // the downgrade, on https's port
		"https://hooks.example.com:8443/", // another port
		"https://hooks.example.com:22/",
		"https://apps.example.com/",        // a wildcard names subdomains only
		"https://api.example.com/",         // the entry names 8443
		"http://api.example.com:8443/",     // and https
		"https://legacy.example.com:8080/", // the entry names http
		"http://legacy.example.com/",       // and 8080
		"https://127.0.0.1:5555/",          // the entry names http
		"https://[2606:4700::1111]/",       // the entry names 8443
		"https://hooks.example.com:0/",     // no such port
		"https://hooks.example.com:65536/", // no such port
		"https://hooks.example.com.evil.test/",
		"https://evil.test/hooks.example.com",
	} {
		err := p.Validate(urlPayload(u))
		var fe *providers.FieldError
		if !errors.As(err, &fe) || fe.Field != "payload.url" {
			t.Errorf("%s: %v, want refused naming payload.url", u, err)
		}
	}
	err = p.Validate(urlPayload("http://hooks.example.com/x"))
	if err == nil || !strings.Contains(err.Error(), "http://hooks.example.com") || !strings.Contains(err.Error(), "443") {
		t.Errorf("the refusal does not say what was refused and what a bare host allows: %v", err)
	}
}

// What the finding did, against real receivers: a tenant names an allowed host on another port (the same
// host's other service) and reads its answer in result.body. The receiver that allowed_hosts does not name
// gets nothing; the one it names, scheme and port included, gets the webhook and its answer is kept.
func TestAllowedHostsRefuseOtherPortsAndSchemesOfAnAllowedHost(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "SSRF", "Payload url on an allowed host with another port, or http where the entry means https",
		"Refused at request time (400 naming payload.url); the receiver on the other port gets nothing")
	allowed := newReceiver(t)
	other := newReceiver(t)
	port := func(r *receiver) string { return r.srv.URL[strings.LastIndex(r.srv.URL, ":")+1:] }
	p, err := New(Config{Secret: secretA, AllowPrivateNetworks: true,
		AllowedHosts: []string{"127.0.0.1", "http://127.0.0.1:" + port(allowed)}})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, u := range []string{other.srv.URL + "/internal-admin", "https://127.0.0.1:" + port(allowed) + "/"} {
		d := delivery("other-port", string(urlPayload(u)))
		var fe *providers.FieldError
		if err := p.Validate(d.Payload); !errors.As(err, &fe) || fe.Field != "payload.url" {
			t.Fatalf("%s: %v, want refused naming payload.url", u, err)
		}
		if o := p.Deliver(context.Background(), d); o.Kind != providers.KindFailed || len(o.Result) != 0 {
			t.Fatalf("%s: deliver %v %s", u, o.Kind, o.Result)
		}
		refused++
	}
	if len(other.requests) != 0 {
		t.Fatalf("the receiver on the other port got %d requests", len(other.requests))
	}
	o := p.Deliver(context.Background(), delivery("allowed", string(urlPayload(allowed.srv.URL+"/mine"))))
	if o.Kind != providers.KindDelivered || !strings.Contains(string(o.Result), `"body"`) || len(allowed.requests) != 1 {
		t.Fatalf("the allowed receiver: %v %v %s", o.Kind, o.Err, o.Result)
	}
	result(fmt.Sprintf("%d/%d refused, 0 requests reached the other port; the named one delivered", refused, refused))
}

// An entry that is not a host, host:port or scheme://host[:port] stops start-up, naming it, rather than
// allowing nothing (or more) without a word.
func TestAllowedHostsEntriesAreChecked(t *testing.T) {
	t.Parallel()
	for _, e := range []string{"", "ftp://h.example", "https://h.example/path", "https://h.example?x=1", "h.example:0",
		"h.example:70000", "h.example:", "h.example:http", "*", "*.", "a.*.example", "*example.com", "u@h.example",
		"https://u:p@h.example", "[fe80::1%eth0]:443", "[::1", "h example", "https://", "h.example:+443", "bücher.example",
		"a:b:c"} {
		_, err := New(Config{Secret: secretA, AllowedHosts: []string{"ok.example", e}})
		if err == nil || !strings.Contains(err.Error(), "allowed_hosts[1]") {
			t.Errorf("%q: %v, want refused naming allowed_hosts[1]", e, err)
		}
	}
	if err := (Config{Secret: secretA, AllowedHosts: []string{"h.example", "h.example:8443", "http://h.example:*",
		"[::1]:8080", "https://[2001:db8::1]", "10.0.0.1", "xn--bcher-kva.example"}}).Validate(); err != nil {
		t.Errorf("good entries refused: %v", err)
	}
}
