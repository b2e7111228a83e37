// Package http is the HTTP dedup proxy provider: it forwards a request (method, path, headers, body) to the
// configured upstream with Idempotency-Key set to the effect's stable ID, and keeps the upstream's status,
// chosen headers and body (bounded) as the effect's result, which every later request with the same key gets
// back instead of a second call. What is kept is the upstream's, as it sent it: the provider never keeps a
// response header named like a configured one, but cannot know what an upstream echoes in its body, and says
// so in the docs. An upstream that honours Idempotency-Key (as Stripe's API does) sees a resend
// after a crash as the same request; one that does not may act twice in that window.
package http

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/oncegate/oncegate/internal/safehttp"
	"github.com/oncegate/oncegate/providers"
)

// Config configures the provider for one effect type. The attempt's timeout is the effect type's: the
// context of each Deliver carries it.
type Config struct {
	// BaseURL is the upstream; a payload's path is appended to it.
	BaseURL string `yaml:"base_url"`
	// Headers are sent with every request, after the payload's (for credentials: "Bearer ${TOKEN}").
	Headers map[string]string `yaml:"headers"`
	// KeepHeaders are the response headers stored in the result. Defaults to Content-Type, Location, ETag and
	// Retry-After.
	KeepHeaders []string `yaml:"keep_headers"`
	// AllowPrivateNetworks lets requests reach loopback, private and link-local addresses. Defaults to false.
	AllowPrivateNetworks bool `yaml:"allow_private_networks"`
}

// MaxBody bounds the upstream's body kept in the result.
const MaxBody = 64 << 10

// Provider forwards requests.
type Provider struct {
	base    *url.URL
	headers http.Header
	keep    []string
	client  *http.Client
	// redact masks configured header values that appear as they were sent in a kept header or the body of
	// a response. It is a courtesy, not the guarantee: an upstream that echoes them in another form (encoded,
	// split) passes it. What holds by structure is that a configured header is never kept from a response,
	// errors never quote an answer, and the docs say that a body is the upstream's, stored as it was sent.
	redact *strings.Replacer
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
	p := &Provider{base: u, headers: http.Header{}}
	var pairs []string
	for k, v := range c.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, fmt.Errorf("http: headers: %w", err)
		}
		p.headers.Set(k, v)
		if len(v) >= 8 {
			pairs = append(pairs, v, "[redacted]")
		}
		if _, token, ok := strings.Cut(v, " "); ok && len(token) >= 8 {
			pairs = append(pairs, token, "[redacted]")
		}
	}
	p.redact = strings.NewReplacer(pairs...)
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
	// Body is a string, sent as it is, or any other JSON value, sent as JSON.
	Body json.RawMessage `json:"body,omitempty"`
}

var methods = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}

// Headers the gateway sets itself, or that would change how the request is framed.
var reserved = map[string]bool{"Idempotency-Key": true, "Host": true, "Content-Length": true,
	"Transfer-Encoding": true, "Connection": true, "Te": true, "Upgrade": true, "Trailer": true}

func checkHeader(k, v string) error {
	if k == "" || strings.ContainsAny(k, " \t\r\n:") || k != strings.TrimSpace(k) {
		return fmt.Errorf("%q is not a header name", k)
	}
	if strings.ContainsAny(v, "\r\n\x00") {
		return fmt.Errorf("header %s: value has a line break or NUL", k)
	}
	return nil
}

func parse(raw json.RawMessage) (Payload, error) {
	var p Payload
	if err := providers.DecodeStrict(raw, &p); err != nil {
		return p, err
	}
	p.Method = strings.ToUpper(p.Method)
	if !methods[p.Method] {
		return p, providers.Invalid("method", "must be GET, POST, PUT, PATCH or DELETE")
	}
	if !strings.HasPrefix(p.Path, "/") || strings.HasPrefix(p.Path, "//") || strings.ContainsAny(p.Path, "\r\n\x00 ") {
		return p, providers.Invalid("path", "must start with a single / and hold no spaces or line breaks")
	}
	rel, err := url.Parse(p.Path)
	if err != nil {
		return p, providers.Invalid("path", "%v", err)
	}
	for _, seg := range strings.Split(rel.Path, "/") {
		// Decoded, so %2e%2e counts too: an upstream that normalises paths would leave base_url's prefix.
		if seg == "." || seg == ".." {
			return p, providers.Invalid("path", "must not hold . or .. segments: a request stays under base_url")
		}
	}
	for k, v := range p.Headers {
		if err := checkHeader(k, v); err != nil {
			return p, providers.Invalid("headers."+k, "%v", err)
		}
		if reserved[textproto.CanonicalMIMEHeaderKey(k)] {
			return p, providers.Invalid("headers."+k, "is set by the gateway")
		}
	}
	return p, nil
}

func (*Provider) Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// Destination is the upstream's host (and port, when base_url names one), never its path or query.
func (p *Provider) Destination(json.RawMessage) string { return strings.ToLower(p.base.Host) }

func (p *Provider) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	pl, err := parse(d.Payload)
	if err != nil {
		return providers.Failed(err, true)
	}
	rel, _ := url.Parse(pl.Path)
	target := *p.base
	target.Path = strings.TrimSuffix(p.base.Path, "/") + rel.Path
	target.RawPath = ""
	target.RawQuery = rel.RawQuery
	var body []byte
	contentType := ""
	if len(pl.Body) > 0 && string(pl.Body) != "null" {
		var s string
		if json.Unmarshal(pl.Body, &s) == nil {
			body = []byte(s)
		} else {
			body, contentType = pl.Body, "application/json"
		}
	}
	req, err := safehttp.NewRequest(ctx, pl.Method, &target, body)
	if err != nil {
		return providers.Failed(err, true)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range pl.Headers {
		req.Header.Set(k, v)
	}
	for k, v := range p.headers {
		req.Header[k] = v
	}
	req.Header.Set("Idempotency-Key", d.StableID)
	resp, err := p.client.Do(req)
	if err != nil {
		return safehttp.TransportError(ctx, err)
	}
	defer resp.Body.Close()
	answer, truncated, _ := safehttp.ReadBounded(resp.Body, MaxBody)
	kept := map[string]string{}
	for _, h := range p.keep {
		if _, configured := p.headers[textproto.CanonicalMIMEHeaderKey(h)]; configured {
			continue // refused by New; kept out here too, by name, whatever the value looks like
		}
		if v := resp.Header.Get(h); v != "" {
			kept[h] = p.redact.Replace(v)
		}
	}
	result := map[string]any{"status": resp.StatusCode, "headers": kept, "body": p.redact.Replace(string(answer))}
	if truncated {
		result["body_truncated"] = true
	}
	return safehttp.Classify(resp.StatusCode, resp.Header, result)
}
