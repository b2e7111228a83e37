// Package webhook is the signed-webhook provider: it POSTs {"type", "timestamp", "data"} to a receiver with
// Standard Webhooks headers. The guarantee it adds is that every attempt and every resend of one effect
// carries the same webhook-id (and the same Idempotency-Key), derived from tenant and key, so a receiver that
// drops ids it has seen receives each effect once; the raw client key is never sent, so two tenants' keys
// never collide at a shared receiver. A resend remains possible after a crash between the receiver's 2xx and
// the gateway's record of it, or when the answer is lost in a timeout.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/safehttp"
	"github.com/oncegate/oncegate/providers"
)

// Config configures the provider for one effect type. The attempt's timeout is the effect type's: the
// context of each Deliver carries it.
type Config struct {
	// URL is the default endpoint; a payload may name another URL, on AllowedHosts only.
	URL string `yaml:"url"`
	// AllowedHosts are the destinations a payload's url may name, each a host and the one scheme and port
	// allowed on it: "hooks.example.com" is https on port 443, "hooks.example.com:8443" https on 8443,
	// "http://hooks.example.com:8080" http on 8080 ("http://host" is port 80, ":*" any port); a host
	// "*.example.com" names its subdomains. A payload url matches when its scheme, host and port all do.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// Secret signs requests: "whsec_" and base64, as Standard Webhooks. Secrets adds more, for rotation:
	// each request carries one signature per secret.
	Secret  string   `yaml:"secret"`
	Secrets []string `yaml:"secrets"`
	// AllowPrivateNetworks lets requests reach loopback, private and link-local addresses. Defaults to false.
	AllowPrivateNetworks bool `yaml:"allow_private_networks"`
}

// MinSecretBytes is the shortest signing key accepted (SPEC §2): a short one can be guessed offline from one
// signed request.
const MinSecretBytes = 24

// MaxResponse bounds the part of a receiver's answer that is kept in the effect's result.
const MaxResponse = 4 << 10

// Provider delivers webhooks.
type Provider struct {
	def     *url.URL
	allowed []allowedHost
	keys    [][]byte
	client  *http.Client
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

// resolve checks the configuration and parses its URL and secrets.
func (c Config) resolve() (*Provider, error) {
	p := &Provider{}
	if c.URL != "" {
		u, err := parseURL(c.URL)
		if err != nil {
			return nil, fmt.Errorf("webhook: url: %w", err)
		}
		p.def = u
	}
	for i, h := range c.AllowedHosts {
		a, err := parseAllowedHost(h)
		if err != nil {
			return nil, fmt.Errorf("webhook: allowed_hosts[%d]: %q: %w", i, h, err)
		}
		p.allowed = append(p.allowed, a)
	}
	secrets := c.Secrets
	if c.Secret != "" {
		secrets = append([]string{c.Secret}, secrets...)
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("webhook: secret: at least one is required (whsec_ and base64)")
	}
	fieldOf := func(i int) string {
		field := fmt.Sprintf("secrets[%d]", i) // secrets is secret, if set, then the list
		if c.Secret != "" {
			field = "secret"
			if i > 0 {
				field = fmt.Sprintf("secrets[%d]", i-1)
			}
		}
		return field
	}
	for i, s := range secrets {
		b64, ok := strings.CutPrefix(s, "whsec_")
		key, err := base64.StdEncoding.DecodeString(b64)
		if !ok || err != nil || len(key) < MinSecretBytes {
			return nil, fmt.Errorf("webhook: %s: want whsec_ and the base64 of at least %d bytes", fieldOf(i), MinSecretBytes)
		}
		// A secret listed twice signs twice: every request carries two equal signatures, and a rotation
		// that meant to add a new secret (and pasted the old one) adds none.
		for j, k := range p.keys {
			if bytes.Equal(k, key) {
				return nil, fmt.Errorf("webhook: %s: the same secret as %s: list each secret once", fieldOf(i), fieldOf(j))
			}
		}
		p.keys = append(p.keys, key)
	}
	if p.def == nil && len(p.allowed) == 0 {
		return nil, fmt.Errorf("webhook: url or allowed_hosts: at least one is required")
	}
	return p, nil
}

// parseURL checks a URL. Its errors never quote the URL: a configured one may hold a token in its path or
// query, and the errors reach the logs.
func parseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("is not a valid URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, errors.New("scheme must be https or http")
	}
	if u.Host == "" || u.User != nil {
		return nil, errors.New("needs a host and no user info")
	}
	if port(u) == 0 {
		return nil, errors.New("port must be 1 to 65535")
	}
	return u, nil
}

// port is the port a request to u connects to: the URL's, or its scheme's. Zero when out of range.
func port(u *url.URL) int {
	if u.Port() == "" {
		return map[string]int{"https": 443, "http": 80}[u.Scheme]
	}
	n, err := strconv.Atoi(u.Port())
	if err != nil || n < 1 || n > 65535 {
		return 0
	}
	return n
}

// allowedHost is an allowed_hosts entry: a host (or "*.domain", for its subdomains), with the scheme and
// port a payload url must use on it. A host that is an IP address is kept in netip's form, an IPv4-mapped
// IPv6 address as its IPv4 address, so that any spelling of the address matches.
type allowedHost struct {
	scheme  string
	host    string
	port    int
	anyPort bool
}

// parseAllowedHost reads "host", "host:port", "[v6]:port" or "scheme://" and one of those. Without a scheme
// an entry means https, and without a port the scheme's own: an operator who names a host has named its
// HTTPS service, and anything else is written out.
func parseAllowedHost(entry string) (allowedHost, error) {
	const want = "is not a host, host:port or http(s)://host[:port] (a host may be *.domain, a port *)"
	a := allowedHost{scheme: "https"}
	rest := strings.ToLower(entry)
	if scheme, after, ok := strings.Cut(rest, "://"); ok {
		if scheme != "https" && scheme != "http" {
			return a, errors.New("scheme must be https or http")
		}
		a.scheme, rest = scheme, strings.TrimSuffix(after, "/")
	}
	portPart := ""
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]")
		if end < 0 {
			return a, errors.New(want)
		}
		addr, err := netip.ParseAddr(rest[1:end])
		if err != nil || !addr.Is6() || addr.Zone() != "" {
			return a, errors.New(want)
		}
		a.host, rest = addr.Unmap().String(), rest[end+1:]
		if rest != "" {
			var ok bool
			if portPart, ok = strings.CutPrefix(rest, ":"); !ok {
				return a, errors.New(want)
			}
		}
	} else {
		host, p, hasPort := strings.Cut(rest, ":")
		if hasPort && p == "" {
			return a, errors.New(want)
		}
		a.host, portPart = host, p
		if addr, err := netip.ParseAddr(host); err == nil {
			a.host = addr.Unmap().String()
		} else if !hostName(host) {
			return a, errors.New(want)
		}
	}
	switch {
	case portPart == "":
		a.port = map[string]int{"https": 443, "http": 80}[a.scheme]
	case portPart == "*":
		a.anyPort = true
	default:
		n, err := strconv.Atoi(portPart)
		if err != nil || strings.Trim(portPart, "0123456789") != "" || n < 1 || n > 65535 {
			return a, errors.New("port must be 1 to 65535, or *")
		}
		a.port = n
	}
	return a, nil
}

// hostName reports whether h is a DNS name in ASCII (an IDN in its xn-- form), optionally "*." and a name.
func hostName(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || strings.HasPrefix(h, ".") || strings.HasSuffix(h, ".") || strings.Contains(h, "..") {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// allows reports whether a request to u is one the entry names: scheme, host and port.
func (a allowedHost) allows(u *url.URL) bool {
	if u.Scheme != a.scheme || (!a.anyPort && port(u) != a.port) {
		return false
	}
	host := strings.ToLower(u.Hostname())
	if addr, err := netip.ParseAddr(host); err == nil {
		host = addr.Unmap().String() // ::ffff:127.0.0.1 is dialled as 127.0.0.1, and is that address
	}
	if domain, ok := strings.CutPrefix(a.host, "*"); ok {
		return strings.HasSuffix(host, domain) && len(host) > len(domain)
	}
	return host == a.host
}

// Payload is a webhook to send.
type Payload struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	URL   string          `json:"url,omitempty"`
}

func (p *Provider) parse(raw json.RawMessage) (Payload, *url.URL, error) {
	var pl Payload
	if err := providers.DecodeStrict(raw, &pl); err != nil {
		return pl, nil, err
	}
	if strings.TrimSpace(pl.Event) == "" || len(pl.Event) > 200 {
		return pl, nil, providers.Invalid("event", "is required, at most 200 bytes")
	}
	if len(pl.Data) == 0 {
		return pl, nil, providers.Invalid("data", "is required (any JSON value)")
	}
	if pl.URL == "" {
		if p.def == nil {
			return pl, nil, providers.Invalid("url", "is required: this effect type has no default url")
		}
		return pl, p.def, nil
	}
	u, err := parseURL(pl.URL)
	if err != nil {
		return pl, nil, providers.Invalid("url", "%v", err)
	}
	for _, a := range p.allowed {
		if a.allows(u) {
			return pl, u, nil
		}
	}
	return pl, nil, providers.Invalid("url", "%s (port %d) is not allowed: no entry of this effect type's "+
		"allowed_hosts names that scheme, host and port (a bare host allows https on port 443 only)",
		safehttp.Origin(u), port(u))
}

func (p *Provider) Validate(payload json.RawMessage) error {
	_, _, err := p.parse(payload)
	return err
}

// Destination is the scheme, host and port of the URL a delivery of payload is posted to, one way for every
// spelling of them (safehttp.Destination): the payload's url when it has one, else the configured url. Never
// the URL's path or query.
func (p *Provider) Destination(payload json.RawMessage) string {
	_, u, err := p.parse(payload)
	if err != nil {
		if p.def == nil {
			return ""
		}
		u = p.def
	}
	return safehttp.Destination(u)
}

// Sign returns the webhook-signature header for one request: "v1,<base64 HMAC-SHA256>" per secret,
// separated by spaces, over "<id>.<timestamp>.<body>".
func Sign(keys [][]byte, id string, ts int64, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		m := hmac.New(sha256.New, k)
		fmt.Fprintf(m, "%s.%d.", id, ts)
		m.Write(body)
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	return strings.Join(sigs, " ")
}

func (p *Provider) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	pl, u, err := p.parse(d.Payload)
	if err != nil {
		return providers.Failed(err, true)
	}
	// The body is the same on every attempt: its timestamp is when the effect was requested. HTML escaping
	// is off so that data arrives as the tenant sent it ("<" stays "<", not "\u003c"), whitespace aside.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err = enc.Encode(struct {
		Type      string          `json:"type"`
		Timestamp string          `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}{pl.Event, d.CreatedAt.UTC().Format(time.RFC3339Nano), pl.Data})
	if err != nil {
		return providers.Failed(err, true)
	}
	body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	req, err := safehttp.NewRequest(safehttp.Track(ctx), http.MethodPost, u, body)
	if err != nil {
		return providers.Failed(err, true)
	}
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "oncegate-webhook/1")
	req.Header.Set("webhook-id", d.StableID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", Sign(p.keys, d.StableID, ts, body))
	safehttp.SetIdempotencyKey(req.Header, d.StableID)
	resp, err := p.client.Do(req)
	if err != nil {
		return safehttp.TransportError(req.Context(), err)
	}
	defer resp.Body.Close()
	result := map[string]any{"status": resp.StatusCode, "webhook_id": d.StableID}
	// The answer of the tenant's own receiver (a payload url) is kept for the tenant. The configured url's
	// receiver is the operator's, and its answer can quote the url, token and all (a default 404 page does):
	// only its status is kept.
	answer, truncated, _ := safehttp.ReadBounded(resp.Body, MaxResponse)
	if u != p.def {
		if len(answer) > 0 {
			result["body"] = string(answer)
		}
		if truncated {
			result["body_truncated"] = true
		}
	}
	return safehttp.Classify(resp.StatusCode, resp.Header, result)
}
