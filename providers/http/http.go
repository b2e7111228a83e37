// Package http is the HTTP dedup proxy provider: it forwards a request (method, path, headers, body) to the
// configured upstream with Idempotency-Key set to the effect's stable ID, and keeps the upstream's status,
// chosen headers and body (bounded) as the effect's result, which every later request with the same key gets
// back instead of a second call. What is kept is the upstream's, as it sent it: the provider never keeps a
// response header named like a configured one, but cannot know what an upstream echoes in its body, and says
// so in the docs. An upstream that honours Idempotency-Key (as Stripe's API does) sees a resend
// after a crash as the same request; one that does not may act twice in that window.
//
// A payload's headers never speak for the gateway: one that reframes the request, belongs to one hop, says
// who is calling or how a proxy routes it, or that a server would read as a configured header, is refused at
// request time, and so is any header net/http would refuse to send. The same table of header classes
// (headers.go) decides what the dedup proxy drops from a client's request and what it refuses: this package
// owns which request header reaches an upstream, for both.
//
// Bytes stay bytes: a header value or a body that JSON cannot carry as text (not UTF-8, or a body with NUL)
// is carried as base64 (headers_base64, body_base64) in payloads and in proxied answers, and reaches the
// upstream or the client as the bytes it was. Masking a configured value echoed in an answer works on bytes,
// so it covers base64 answers as it does text ones.
package http

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/oncegate/oncegate/internal/safehttp"
	"github.com/oncegate/oncegate/providers"
)

// Config configures the provider for one effect type. The attempt's timeout is the effect type's: the
// context of each Deliver carries it.
type Config struct {
	// BaseURL is the upstream; a payload's path is appended to it.
	BaseURL string `yaml:"base_url"`
	// Headers are sent with every request (for credentials: "Bearer ${TOKEN}"). A payload may not set one,
	// in any spelling a server reads as the same.
	Headers map[string]string `yaml:"headers"`
	// KeepHeaders are the response headers stored in the result. Defaults to Content-Type, Location, ETag and
	// Retry-After.
	KeepHeaders []string `yaml:"keep_headers"`
	// AllowPrivateNetworks lets requests reach loopback, private and link-local addresses. Defaults to false.
	AllowPrivateNetworks bool `yaml:"allow_private_networks"`
	// MaxAnswer bounds, in bytes, the body of an answer stored for a proxied request (/v1/proxy), which is
	// replayed byte for byte. An answer over it is recorded without its body (body_over_limit), and every
	// request under its key gets a problem saying so. Defaults to DefaultMaxAnswer.
	MaxAnswer int64 `yaml:"max_answer"`
}

// redacted replaces a configured header's value wherever an answer echoes it.
const redacted = "[redacted]"

// DefaultMaxAnswer is the default Config.MaxAnswer: 1 MiB.
const DefaultMaxAnswer = 1 << 20

// MaxBody bounds the upstream's body kept in the result.
const MaxBody = 64 << 10

// Provider forwards requests.
type Provider struct {
	base    *url.URL
	headers http.Header
	keep    []string
	client  *http.Client
	// maxAnswer is Config.MaxAnswer.
	maxAnswer int64
	// folded maps each configured header's folded name (see fold) to its name, so that a payload header
	// that a server would read as a configured one is refused.
	folded map[string]string
	// redact masks configured header values that appear as they were sent in a kept header or the body of
	// a response. It is a courtesy, not the guarantee: an upstream that echoes them in another form (encoded,
	// split) passes it. What holds by structure is that a configured header is never kept from a response,
	// errors never quote an answer, and the docs say that a body is the upstream's, stored as it was sent.
	redact *strings.Replacer
	// secrets are the values redact masks, for the streamed form of the same masking (MaskStream).
	secrets []string
}

// Validate reports the first setting that New would refuse, without building a provider.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

// New checks the configuration and returns a provider. Close releases its idle connections.
func New(c Config) (*Provider, error) {
	p, err := c.resolve()
	if err != nil {
		return nil, err
	}
	p.client = safehttp.Client(c.AllowPrivateNetworks)
	return p, nil
}

// Close releases the provider's idle connections. Deliveries must have stopped.
func (p *Provider) Close() error {
	p.client.CloseIdleConnections()
	return nil
}

// resolve checks the configuration and parses its URL and headers.
func (c Config) resolve() (*Provider, error) {
	// The error does not quote base_url: its path or query may hold a token, and the error reaches the logs.
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return nil, errors.New("http: base_url: want an http or https URL with a host and no user info (credentials go in headers)")
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		// A query here would be dropped by every request (each takes the payload path's query), so a token in
		// it would silently never be sent.
		return nil, errors.New("http: base_url: no query or fragment: a request's query comes from its payload path, " +
			"and credentials go in headers")
	}
	p := &Provider{base: u, headers: http.Header{}, folded: map[string]string{}}
	var pairs []string
	for k, v := range c.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, fmt.Errorf("http: headers: %w", err)
		}
		if f := fold(k); hopClass.names[f] || gatewayClass.has(f) {
			// The names, not hopClass's Proxy-* prefix: an operator may address a forward proxy on the way
			// (Proxy-Authorization), which a tenant may not.
			return nil, fmt.Errorf("http: headers: %s is set by the gateway, or belongs to one connection", k)
		}
		p.headers.Set(k, v)
		p.folded[fold(k)] = k
		if len(v) >= 8 {
			pairs = append(pairs, v, redacted)
			p.secrets = append(p.secrets, v)
		}
		if _, token, ok := strings.Cut(v, " "); ok && len(token) >= 8 {
			pairs = append(pairs, token, redacted)
			p.secrets = append(p.secrets, token)
		}
	}
	p.redact = strings.NewReplacer(pairs...)
	if c.MaxAnswer < 0 {
		return nil, errors.New("http: max_answer: must not be negative")
	}
	p.maxAnswer = c.MaxAnswer
	if p.maxAnswer == 0 {
		p.maxAnswer = DefaultMaxAnswer
	}
	p.keep = c.KeepHeaders
	if len(p.keep) == 0 {
		p.keep = []string{"Content-Type", "Location", "ETag", "Retry-After"}
	}
	for _, h := range p.keep {
		if _, configured := p.headers[textproto.CanonicalMIMEHeaderKey(h)]; configured {
			return nil, fmt.Errorf("http: keep_headers: %s is a configured request header (a credential, typically), "+
				"and a response's %s is never kept", h, h)
		}
	}
	return p, nil
}

// Payload is a request to forward.
type Payload struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers,omitempty"`
	// HeadersBase64 are headers whose value is raw bytes, standard base64: the proxy records a value that is
	// not UTF-8 (obs-text) this way, which JSON would turn into U+FFFD. A name is in one of the two maps.
	HeadersBase64 map[string]string `json:"headers_base64,omitempty"`
	// Body is a string, sent as it is, or any other JSON value (null included), sent as JSON with
	// Content-Type application/json. Absent, the request has no body.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyBase64 is a body of raw bytes, standard base64: the proxy records a body that is not UTF-8 text
	// this way. At most one of Body and BodyBase64.
	BodyBase64 string `json:"body_base64,omitempty"`
	// Proxied marks a request recorded by the dedup proxy (/v1/proxy): its result keeps the whole answer,
	// every end-to-end header and up to max_answer bytes of body, to be replayed as it came (see Answer).
	Proxied bool `json:"proxied,omitempty"`
}

var methods = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true,
	"HEAD": true, "OPTIONS": true}

func (p *Provider) parse(raw json.RawMessage) (Payload, error) {
	var pl Payload
	if err := providers.DecodeStrict(raw, &pl); err != nil {
		return pl, err
	}
	pl.Method = strings.ToUpper(pl.Method)
	if !methods[pl.Method] {
		return pl, providers.Invalid("method", "must be GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS")
	}
	if pl.BodyBase64 != "" {
		if len(pl.Body) > 0 {
			return pl, providers.Invalid("body_base64", "body and body_base64 exclude each other")
		}
		if _, err := base64.StdEncoding.DecodeString(pl.BodyBase64); err != nil {
			return pl, providers.Invalid("body_base64", "must be standard base64: %v", err)
		}
	}
	// A proxied request sent to /v1/proxy/{type} itself, with no path after it, goes to base_url as written.
	bare := pl.Proxied && (pl.Path == "" || strings.HasPrefix(pl.Path, "?"))
	if (!bare && (!strings.HasPrefix(pl.Path, "/") || strings.HasPrefix(pl.Path, "//"))) ||
		strings.ContainsAny(pl.Path, "\r\n\x00 ") {
		return pl, providers.Invalid("path", "must start with a single / and hold no spaces or line breaks")
	}
	rel, err := url.Parse(pl.Path)
	if err != nil {
		return pl, providers.Invalid("path", "%v", err)
	}
	if strings.HasPrefix(rel.Path, "//") {
		// %2F%2F decodes to the same "//" that is refused raw: an upstream that decodes before routing, or a
		// base_url without a path, would read an authority there.
		return pl, providers.Invalid("path", "must not start with // once decoded (%%2F%%2F too)")
	}
	// Decoded, so %2e%2e and %5c count too: an upstream that normalises paths would leave base_url's prefix.
	if strings.Contains(rel.Path, `\`) {
		// IIS, and servers on Windows, read a backslash as "/": "/a\..\..\x" climbs two levels there.
		return pl, providers.Invalid("path", `must not hold a backslash (\ or %%5C), which some servers read as /`)
	}
	for _, seg := range strings.Split(rel.Path, "/") {
		// Tomcat and Spring drop a segment's ;parameters before they resolve dot segments: "..;x" is "..".
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return pl, providers.Invalid("path", "must not hold . or .. segments (nor ..;x, which some servers "+
				"read as ..): a request stays under base_url")
		}
	}
	h, err := pl.headers()
	if err != nil {
		return pl, err
	}
	// A stored effect is delivered whatever a class refused only since it was stored (request leaves those
	// headers out); Validate refuses them when an effect is created.
	return pl, p.checkHeaders(h, true)
}

func (p *Provider) Validate(payload json.RawMessage) error {
	pl, err := p.parse(payload)
	if err != nil {
		return err
	}
	h, _ := pl.headers() // checked by parse
	return p.checkHeaders(h, false)
}

// Destination is the upstream's scheme, host and port (safehttp.Destination), never its path or query.
func (p *Provider) Destination(json.RawMessage) string { return safehttp.Destination(p.base) }

func (p *Provider) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	pl, err := p.parse(d.Payload)
	if err != nil {
		return providers.Failed(err, true)
	}
	req, err := p.request(safehttp.Track(ctx), pl)
	if err != nil {
		return providers.Failed(err, true)
	}
	safehttp.SetIdempotencyKey(req.Header, d.StableID)
	resp, err := p.client.Do(req)
	if err != nil {
		return safehttp.TransportError(req.Context(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 {
		// A 1xx as the final answer (net/http hands back only 101) is no answer to this request: forwarded,
		// it would switch a client's connection to another protocol. Failed: the upstream would answer a
		// resend the same way.
		return providers.Failed(fmt.Errorf("destination answered %d, an interim status, as its final answer",
			resp.StatusCode), true)
	}
	if pl.Proxied {
		return p.answer(resp)
	}
	answer, truncated, rerr := safehttp.ReadBounded(resp.Body, MaxBody)
	if rerr != nil && resp.StatusCode < 300 {
		// A 2xx whose body broke off: the result would be stored, and replayed, cut short, as if whole. What
		// the upstream did is unknown to the gateway, as after a timeout (a resend carries the same
		// Idempotency-Key; under at_most_once the effect is unknown).
		o := providers.Retry(fmt.Errorf("reading the answer (status %d): %w", resp.StatusCode, rerr))
		o.MaybeSent = true
		return o
	}
	truncated = truncated || rerr != nil // another status decides by itself; its body is only a note
	// Bytes stay bytes, as in a proxied answer: what JSON cannot carry as text is base64.
	kept, keptBytes := map[string]string{}, map[string]string{}
	for _, h := range p.keep {
		if _, configured := p.headers[textproto.CanonicalMIMEHeaderKey(h)]; configured {
			continue // refused by New; kept out here too, by name, whatever the value looks like
		}
		switch v := p.redact.Replace(resp.Header.Get(h)); {
		case v == "":
		case utf8.ValidString(v):
			kept[h] = v
		default:
			keptBytes[h] = base64.StdEncoding.EncodeToString([]byte(v))
		}
	}
	result := map[string]any{"status": resp.StatusCode, "headers": kept}
	if len(keptBytes) > 0 {
		result["headers_base64"] = keptBytes
	}
	if truncated {
		result["body_truncated"] = true
		// A text cut inside a character is still text.
		for i := 1; i < utf8.UTFMax && i <= len(answer) && !utf8.Valid(answer); i++ {
			if utf8.Valid(answer[:len(answer)-i]) {
				answer = answer[:len(answer)-i]
			}
		}
	}
	if body := p.redact.Replace(string(answer)); utf8.ValidString(body) && !strings.Contains(body, "\x00") {
		result["body"] = body
	} else {
		result["body_base64"] = base64.StdEncoding.EncodeToString([]byte(body))
	}
	return safehttp.Classify(resp.StatusCode, resp.Header, result)
}

// request builds the request of a payload checked by parse, with the configured headers and without an
// Idempotency-Key.
func (p *Provider) request(ctx context.Context, pl Payload) (*http.Request, error) {
	rel, _ := url.Parse(pl.Path)
	target := *p.base
	if rel.Path != "" {
		// Encoded as the client sent it (a%2Fb stays one segment, %41 stays %41): RawPath is kept by net/http
		// when it is a valid encoding of Path, which an escaped form joined to an escaped form is.
		target.Path = strings.TrimSuffix(p.base.Path, "/") + rel.Path
		target.RawPath = strings.TrimSuffix(p.base.EscapedPath(), "/") + rel.EscapedPath()
	}
	target.RawQuery = rel.RawQuery
	var body []byte
	contentType := ""
	switch {
	case pl.BodyBase64 != "":
		body, _ = base64.StdEncoding.DecodeString(pl.BodyBase64) // checked by parse
	case len(pl.Body) > 0: // a JSON null is a JSON value, sent as JSON; an absent body is no body
		var s string
		if pl.Body[0] == '"' && json.Unmarshal(pl.Body, &s) == nil { // a string; null would unmarshal as ""
			body = []byte(s)
		} else {
			body, contentType = pl.Body, "application/json"
		}
	}
	req, err := safehttp.NewRequest(ctx, pl.Method, &target, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	h, _ := pl.headers() // checked by parse
	for k, v := range h {
		if c, _ := p.class(k); c == nil || !c.stored {
			req.Header.Set(k, v)
		}
	}
	for k, v := range p.headers {
		req.Header[k] = v
	}
	return req, nil
}

// Answer is a proxied request's result, as stored and replayed: the upstream's status, its end-to-end
// headers (AnswerHeaders), and its body as text (Body, when it is UTF-8 without NUL, which Postgres's jsonb
// cannot hold) or as base64 (BodyBase64). BodyOverLimit says that the body was over max_answer and was not
// kept.
type Answer struct {
	Status  int                 `json:"status"`
	Headers map[string][]string `json:"headers"`
	// HeadersBase64 holds the headers with a line that is not UTF-8 (obs-text, Latin-1 most often), each
	// line standard base64: JSON would turn its bytes into U+FFFD. Each line is checked by itself, and a header
	// with one such line has all its lines here, in their order.
	HeadersBase64 map[string][]string `json:"headers_base64,omitempty"`
	Body          *string             `json:"body,omitempty"`
	BodyBase64    *string             `json:"body_base64,omitempty"`
	BodyOverLimit bool                `json:"body_over_limit,omitempty"`
	MaxAnswer     int64               `json:"max_answer,omitempty"`
}

// Header returns the headers as they came.
func (a Answer) Header() http.Header {
	h := http.Header{}
	for k, vs := range a.Headers {
		h[k] = append([]string(nil), vs...)
	}
	for k, vs := range a.HeadersBase64 {
		for _, v := range vs {
			b, _ := base64.StdEncoding.DecodeString(v)
			h[k] = append(h[k], string(b))
		}
	}
	return h
}

// Bytes returns the body as it came.
func (a Answer) Bytes() []byte {
	switch {
	case a.Body != nil:
		return []byte(*a.Body)
	case a.BodyBase64 != nil:
		b, _ := base64.StdEncoding.DecodeString(*a.BodyBase64)
		return b
	}
	return nil
}

// answer reads a proxied request's whole answer into its result, classified as any other.
func (p *Provider) answer(resp *http.Response) providers.Outcome {
	body, over, err := safehttp.ReadBounded(resp.Body, p.maxAnswer)
	if err != nil {
		// The upstream answered and its body broke off: what it did is unknown to the gateway, as for a
		// timeout. Retried (a resend carries the same Idempotency-Key).
		o := providers.Retry(fmt.Errorf("reading the answer (status %d): %w", resp.StatusCode, err))
		o.MaybeSent = true
		return o
	}
	a := Answer{Status: resp.StatusCode, Headers: map[string][]string{}}
	for k, vs := range p.AnswerHeaders(resp.Header) {
		// Line by line, never joined: "\xc3" and "\xa9" are UTF-8 only together, and each would be U+FFFD.
		if !slices.ContainsFunc(vs, func(v string) bool { return !utf8.ValidString(v) }) {
			a.Headers[k] = vs
			continue
		}
		if a.HeadersBase64 == nil {
			a.HeadersBase64 = map[string][]string{}
		}
		for _, v := range vs {
			a.HeadersBase64[k] = append(a.HeadersBase64[k], base64.StdEncoding.EncodeToString([]byte(v)))
		}
	}
	switch {
	case over:
		a.BodyOverLimit, a.MaxAnswer = true, p.maxAnswer
	case utf8.Valid(body) && bytes.IndexByte(body, 0) < 0:
		s := p.redact.Replace(string(body))
		a.Body = &s
	default:
		// Masked as text is: the values are bytes, and so is the body.
		s := base64.StdEncoding.EncodeToString([]byte(p.redact.Replace(string(body))))
		a.BodyBase64 = &s
	}
	return safehttp.Classify(resp.StatusCode, resp.Header, a)
}

// AnswerHeaders returns the headers of an upstream's answer that go to a client: without the hop-by-hop
// ones (hopClass, in any spelling, as for a request; and those the Connection header names), Content-Length
// (the gateway frames its own answer), and any header that a server would read as a configured request
// header (a credential echoed back); values holding a configured value as it was sent are masked.
func (p *Provider) AnswerHeaders(h http.Header) http.Header {
	out := h.Clone()
	for _, c := range h.Values("Connection") {
		for _, name := range strings.Split(c, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for name, vs := range out {
		if _, configured := p.folded[fold(name)]; configured || hopClass.has(fold(name)) {
			delete(out, name)
			continue
		}
		for i, v := range vs {
			vs[i] = p.redact.Replace(v)
		}
	}
	return out
}

// Pass sends a request recorded nowhere (a safe method through the proxy) and returns the upstream's answer
// for the caller to stream and close; its headers are the upstream's, unfiltered (see AnswerHeaders). The
// payload's rules are Validate's.
func (p *Provider) Pass(ctx context.Context, payload json.RawMessage) (*http.Response, error) {
	pl, err := p.parse(payload)
	if err != nil {
		return nil, err
	}
	req, err := p.request(ctx, pl)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, safehttp.TransportError(ctx, err).Err
	}
	return resp, nil
}
