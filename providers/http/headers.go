package http

// The request header policy of the http provider and of the dedup proxy, which records its requests as this
// provider's payloads: one normalisation of names (fold) and one table of header classes, each with its
// decision. Validate reads it for a payload's headers; Proxied, for the headers of a request sent to
// /v1/proxy. Nothing else decides which request header reaches an upstream.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/oncegate/oncegate/providers"
)

// Decision is what becomes of a request header of one class.
type Decision int

const (
	// Send: the header goes to the upstream as it came.
	Send Decision = iota
	// Drop: the header is left out, and the request goes on without it.
	Drop
	// Refuse: the request is a 400 naming the header, and nothing is recorded or sent.
	Refuse
)

// headerClass is a class of request headers and its decision, by where the header comes from.
//
// Why a class may be decided twice, and only here. A payload posted to /v1/effects is written by a tenant,
// header by header: a header of any class below is there on purpose, and a 400 naming it tells the tenant at
// once that the upstream will never get it. A request sent to the proxy is an HTTP client's, and it crossed a
// network: its framing and hop headers are on every request, an SDK sets its own credentials and compression,
// and a CDN or load balancer in front of the gateway adds forwarding and client-IP headers that the client
// neither sees nor can remove. The proxy drops those (the upstream's client is the gateway, which frames its
// own request and holds the credential), where refusing them would make every such request a 400. What a
// client sets only to change what the upstream does with the request (a session, a method override, a
// rewritten URL) is refused on both: dropped, the request would silently mean something else upstream.
type headerClass struct {
	name     string          // the class, for tests and errors
	why      string          // a refusal's reason, after the header's name
	names    map[string]bool // folded
	prefixes []string        // folded
	payload  Decision        // for a payload's headers
	proxied  Decision        // for a request's headers at /v1/proxy
	// stored marks a class that payloads could hold before it was refused (all of it, or names added to it
	// since): an effect stored with one is still delivered, without the header, rather than failing at every
	// attempt. Validate refuses it in a new payload all the same.
	stored bool
}

func set(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

var (
	// hopClass: the headers of one connection (RFC 9110 §7.6.1), those addressed to a proxy on the way, and the
	// framing net/http derives from the request; from a tenant or an operator they would reframe the request
	// or speak to a proxy that is not there.
	hopClass = headerClass{name: "hop-by-hop", why: "belongs to one connection, or to the framing the gateway sets",
		names: set("connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "content-length",
			"host", "proxy-connection"),
		prefixes: []string{"proxy-"}, payload: Refuse, proxied: Drop}
	// gatewayClass: what the gateway sets on every request: the effect's stable id as Idempotency-Key.
	gatewayClass = headerClass{name: "gateway-owned", why: "is set by the gateway (the effect's stable id)",
		names: set("idempotency-key"), payload: Refuse, proxied: Drop}
	// traceClass: W3C trace context. The upstream gets the trace context of the request that created the
	// effect, as every destination does, never one a payload writes (a malformed or outsized traceparent, a
	// tracestate riding on another request's traceparent), and never baggage.
	traceClass = headerClass{name: "trace context", why: "is trace context, which the gateway sets from the request " +
		"that created the effect (send it as that request's header); baggage is never sent",
		names: set("traceparent", "tracestate", "baggage"), payload: Refuse, proxied: Drop, stored: true}
	// frontClass: what a proxy, CDN or load balancer in front of the gateway adds to say who is calling and
	// from where. Upstreams trust them: a tenant's value would pass for the gateway's own.
	frontClass = headerClass{name: "added in front", why: "says who is calling and from where, which a proxy in front " +
		"of the upstream adds: the upstream would take a tenant's value for the gateway's",
		names: set("forwarded", "via", "x-real-ip", "x-client-ip", "true-client-ip", "cf-connecting-ip",
			"cf-connecting-ipv6", "x-cluster-client-ip", "fastly-client-ip", "x-original-forwarded-for",
			"x-azure-clientip", "x-azure-socketip", "x-envoy-external-address"),
		// stored: Via and the client-IP names from CF-Connecting-IPv6 on were sent from payloads until issue 27
		// (the proxy recorded them too).
		prefixes: []string{"x-forwarded-"}, payload: Refuse, proxied: Drop, stored: true}
	// routingClass: which session a request holds, and where and by which method a front end routes it: it
	// would leave base_url's path or the allowed methods, or act as someone's session.
	routingClass = headerClass{name: "routing", why: "holds a session, or says how a front end routes the request " +
		"(another path or method): the upstream would act on it",
		names: set("cookie", "x-original-url", "x-rewrite-url", "x-http-method-override", "x-http-method",
			"x-method-override"), payload: Refuse, proxied: Refuse}
	// toGatewayClass: what a request to the proxy says to the gateway and not to the upstream: its credential
	// (Authorization; the key header, proxy.api_key_header, is added by Proxied), the gateway's Oncegate-*
	// headers, and Expect and Accept-Encoding, with which an HTTP client negotiates with the gateway (whose own
	// client negotiates compression with the upstream and stores the body decoded). In a payload they are the
	// tenant's, for the upstream.
	toGatewayClass = headerClass{name: "addressed to the gateway", names: set("authorization", "expect", "accept-encoding"),
		prefixes: []string{"oncegate-"}, payload: Send, proxied: Drop}
	// configuredClass: the effect type's http.headers (a credential, typically), in any spelling a server
	// reads as the same: the gateway's, never a client's. Its names are the provider's (Provider.folded).
	configuredClass = headerClass{name: "configured", why: "is this effect type's configured header %s (servers read " +
		"- and _ alike, and case never counts)", payload: Refuse, proxied: Drop}
	// connectionClass: a header a proxied request's Connection names, which belongs to that connection.
	connectionClass = headerClass{name: "named by Connection", payload: Send, proxied: Drop}
)

// classes are the static classes, in the order a name is looked up.
var classes = []*headerClass{&hopClass, &gatewayClass, &traceClass, &frontClass, &routingClass, &toGatewayClass}

func (c *headerClass) has(folded string) bool {
	if c.names[folded] {
		return true
	}
	for _, p := range c.prefixes {
		if strings.HasPrefix(folded, p) {
			return true
		}
	}
	return false
}

// fold spells a header name as the servers that conflate names read it: nginx (underscores_in_headers), CGI,
// WSGI and PHP turn "-" and "_" (and some, "." too) into one, and case never counts. Two names with one fold
// are one header to such an upstream. It is the one normalisation of the policy: every class is looked up by it.
func fold(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, name)
}

// class returns the class of a request header name, nil for an ordinary header, and for the configured class
// the configured header's name.
// A configured name is looked up first: an operator may configure a header of the routing class (Cookie), and
// a proxied request's own is then dropped for the gateway's, as any configured header's is.
func (p *Provider) class(name string) (c *headerClass, configured string) {
	f := fold(name)
	if configured, ok := p.folded[f]; ok {
		return &configuredClass, configured
	}
	for _, c := range classes {
		if c.has(f) {
			return c, ""
		}
	}
	return nil, ""
}

// refusal is the error for a header a class refuses.
func refusal(name string, c *headerClass, configured string) error {
	why := c.why
	if c == &configuredClass {
		why = fmt.Sprintf(why, configured)
	}
	return providers.Invalid("headers."+name, "%s", why)
}

// checkHeader refuses what net/http would refuse when sending: a name that is not an HTTP token (RFC 9110
// §5.6.2), a value with a control byte other than tab (CR, LF and NUL among them). Caught here, such a
// header is a 400 at request time rather than an effect that fails at every attempt. Bytes from 0x80 are
// obs-text, sent as they are.
func checkHeader(k, v string) error {
	if !httpguts.ValidHeaderFieldName(k) {
		return fmt.Errorf("%q is not a header name: letters, digits and !#$%%&'*+-.^_`|~ only", k)
	}
	if !httpguts.ValidHeaderFieldValue(v) {
		return fmt.Errorf("header %s: value has a control character (a line break, NUL, DEL; tab is allowed)", k)
	}
	return nil
}

// headers returns a payload's headers, name to value as bytes, from headers and headers_base64 alike. A name
// set in both (as net/http canonicalises it) is refused: one would overwrite the other.
func (pl Payload) headers() (map[string]string, error) {
	out := make(map[string]string, len(pl.Headers)+len(pl.HeadersBase64))
	for k, v := range pl.Headers {
		out[k] = v
	}
	canon := map[string]bool{}
	for k := range pl.Headers {
		canon[http.CanonicalHeaderKey(k)] = true
	}
	for k, v := range pl.HeadersBase64 {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, providers.Invalid("headers_base64."+k, "must be standard base64: %v", err)
		}
		if canon[http.CanonicalHeaderKey(k)] {
			return nil, providers.Invalid("headers."+k, "is in both headers and headers_base64: set it once")
		}
		out[k] = string(b)
	}
	return out, nil
}

// checkHeaders refuses a payload's header that net/http would refuse to send, or that a class refuses in a
// payload; with stored, a class refused only since effects were stored with it passes (request leaves it out).
// Names are tried in order, so that the error names the same header every time.
func (p *Provider) checkHeaders(h map[string]string, stored bool) error {
	for _, k := range slices.Sorted(maps.Keys(h)) {
		v := h[k]
		if err := checkHeader(k, v); err != nil {
			return providers.Invalid("headers."+k, "%v", err)
		}
		c, configured := p.class(k)
		if c == nil || c.payload != Refuse || (stored && c.stored) {
			continue
		}
		return refusal(k, c, configured)
	}
	return nil
}

// Proxied builds the payload of a request sent to the dedup proxy, checked as Validate checks any payload:
// its method, its path under the type (query included, percent-encoding as sent), its headers as the policy
// above decides for a proxied request, and its body, as bytes. keyHeader is the header that carried the
// tenant's API key to the gateway, dropped too.
//
// Bytes stay bytes: a header value that is not UTF-8 (obs-text, Latin-1 most often) is carried in
// headers_base64, and a body that is not UTF-8, or holds NUL (which Postgres's jsonb cannot hold), in
// body_base64, because JSON would turn those bytes into U+FFFD. Repeated lines of a header are sent once,
// joined with ", " (RFC 9110 §5.3); the joined value, as it is sent, decides its encoding.
func (p *Provider) Proxied(method, path string, h http.Header, body []byte, keyHeader string) (json.RawMessage, error) {
	named := map[string]bool{}
	for _, c := range h.Values("Connection") {
		for _, name := range strings.Split(c, ",") {
			named[fold(strings.TrimSpace(name))] = true
		}
	}
	pl := Payload{Method: method, Path: path, Proxied: true}
	for name, vs := range h {
		c, configured := p.class(name)
		switch {
		case c == nil && fold(name) == fold(keyHeader):
			c = &toGatewayClass
		case c == nil && named[fold(name)]:
			c = &connectionClass
		}
		if c != nil && c.proxied == Drop {
			continue
		}
		if c != nil && c.proxied == Refuse {
			return nil, refusal(name, c, configured)
		}
		v := strings.Join(vs, ", ")
		if utf8.ValidString(v) {
			if pl.Headers == nil {
				pl.Headers = map[string]string{}
			}
			pl.Headers[name] = v
			continue
		}
		if pl.HeadersBase64 == nil {
			pl.HeadersBase64 = map[string]string{}
		}
		pl.HeadersBase64[name] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	switch {
	case len(body) == 0:
	case utf8.Valid(body) && !strings.Contains(string(body), "\x00"):
		pl.Body, _ = json.Marshal(string(body))
	default:
		pl.BodyBase64 = base64.StdEncoding.EncodeToString(body)
	}
	payload, err := json.Marshal(pl)
	if err != nil {
		return nil, fmt.Errorf("the request cannot be recorded: %w", err)
	}
	if err := p.Validate(payload); err != nil {
		return nil, err
	}
	return payload, nil
}
