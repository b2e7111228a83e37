// Package safehttp is the HTTP client that providers use to reach destinations named in configuration or in
// payloads. It refuses private destinations at dial time, after DNS resolution, so neither a hostile URL nor a
// name that resolves to a public address first and a private one later (DNS rebinding) reaches loopback,
// private networks, link-local or cloud metadata addresses unless private networks are allowed. It never
// follows redirects (a 3xx is the answer) and never uses proxies from the environment.
//
// It also keeps an operator's URLs out of what a tenant or a log sees: an error from a request names the
// destination by scheme and host only (Origin, TransportError), since a configured URL's path and query may
// hold a token, and net/http's *url.Error carries the whole URL.
package safehttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/providers"
)

// ErrForbiddenAddress is returned when a destination resolves to an address that is not allowed.
var ErrForbiddenAddress = errors.New("destination address is not allowed")

var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and broadcast
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64 (RFC 8215): its IPv4 side is the operator's
	netip.MustParsePrefix("::/96"),           // IPv4-compatible (RFC 4291 §2.5.5.1), deprecated; holds :: and ::1
	netip.MustParsePrefix("::ffff:0:0:0/96"), // SIIT's IPv4-translated form (RFC 2765), obsoleted
	netip.MustParsePrefix("fec0::/10"),       // site-local (RFC 3879), deprecated but still routed inside some sites
}

// Prefixes whose addresses reach an IPv4 address through a translator or a relay, which delivers to that
// IPv4 address wherever it is: such an address is judged as every IPv4 address it carries (embeddedIPv4).
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052: the IPv4 address is the last 32 bits
	sixToFour = netip.MustParsePrefix("2002::/16")    // RFC 3056: bits 16 to 48
	teredo    = netip.MustParsePrefix("2001::/32")    // RFC 4380: the server in bits 32 to 64, the client inverted in 96 to 128
)

// Forbidden reports whether addr is loopback, private (RFC 1918, IPv6 ULA), link-local (which holds the
// metadata address 169.254.169.254), CGNAT, unspecified, multicast or reserved, or a deprecated IPv6 form
// (IPv4-compatible, SIIT, site-local). IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry,
// and so are NAT64, 6to4 and Teredo addresses: one that carries a forbidden IPv4 address is forbidden.
func Forbidden(addr netip.Addr) bool {
	addr = addr.Unmap()
	if addr.IsLoopback() || addr.IsPrivate() || addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() ||
		addr.IsInterfaceLocalMulticast() || addr.IsMulticast() || addr.IsUnspecified() || !addr.IsValid() {
		return true
	}
	for _, p := range blocked {
		if p.Contains(addr) {
			return true
		}
	}
	for _, v4 := range embeddedIPv4(addr) {
		if Forbidden(v4) {
			return true
		}
	}
	return false
}

// embeddedIPv4 returns the IPv4 addresses that a NAT64, 6to4 or Teredo address reaches (a Teredo address
// names two: its server and its client); none for any other address.
func embeddedIPv4(addr netip.Addr) []netip.Addr {
	b := addr.As16()
	switch {
	case !addr.Is6():
		return nil
	case nat64.Contains(addr):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
	case sixToFour.Contains(addr):
		return []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
	case teredo.Contains(addr):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return []netip.Addr{netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4(client)}
	}
	return nil
}

// Client returns an HTTP client for destinations. With allowPrivate false, every connection to a forbidden
// address fails with ErrForbiddenAddress.
func Client(allowPrivate bool) *http.Client { return client(allowPrivate, nil) }

// client is Client with then, when not nil, run on each dial the guard lets through, before it connects:
// tests use it to stop those dials, so that a test of the guard sends nothing anywhere even if it fails.
func client(allowPrivate bool, then func(network, address string, c syscall.RawConn) error) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	dialer.Control = func(network, address string, c syscall.RawConn) error {
		if !allowPrivate {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
			}
			if Forbidden(ap.Addr()) {
				return fmt.Errorf("%w: %s is a private, loopback, link-local or reserved address, or carries one", ErrForbiddenAddress, ap.Addr())
			}
		}
		if then != nil {
			return then(network, address, c)
		}
		return nil
	}
	base := &http.Transport{
		Proxy:             nil,
		DialContext:       dialer.DialContext,
		ForceAttemptHTTP2: true,
		// A connection is idle only once it has been needed: keeping as many as were in use at once (up to
		// an effect type's concurrency to one host) costs a descriptor each until IdleConnTimeout, where a
		// smaller cap closed the surplus whenever deliveries went idle together, to dial it again a moment
		// later (TestConnectionsInUseAtOnceAreKept).
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0, // the request's context carries the effect type's timeout
	}
	return &http.Client{
		Transport: &traced{base: base,
			// The trace context only: W3C baggage in a request's context is what its client sent (the proxy
			// passes a tenant's request on), and is not the gateway's to hand a destination.
			spans: otelhttp.NewTransport(base, otelhttp.WithPropagators(propagation.TraceContext{}))},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// traced sends the trace context to the destination, with a client span when the request's span records one.
// A span that records nothing (no exporter configured, or a trace not sampled) would make otelhttp's client
// span record nothing too, yet its work for each request (the span, its attributes, its metrics' options)
// was a twentieth of a gateway's CPU for a webhook (issue 14): such a request gets the traceparent of its
// own span context and goes out as it is.
type traced struct {
	base  *http.Transport
	spans http.RoundTripper // base behind otelhttp
}

// CloseIdleConnections lets http.Client's, which a provider's Close calls, reach the transport.
func (t *traced) CloseIdleConnections() { t.base.CloseIdleConnections() }

func (t *traced) RoundTrip(r *http.Request) (*http.Response, error) {
	span := trace.SpanFromContext(r.Context())
	if span.IsRecording() {
		return t.spans.RoundTrip(r)
	}
	if !span.SpanContext().IsValid() {
		return t.base.RoundTrip(r)
	}
	// A RoundTripper must not change the request it is given.
	r = r.Clone(r.Context())
	propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	return t.base.RoundTrip(r)
}

// ReadBounded reads at most n bytes of r and reports whether there was more.
func ReadBounded(r io.Reader, n int64) ([]byte, bool, error) {
	b, err := io.ReadAll(io.LimitReader(r, n+1))
	if int64(len(b)) > n {
		return b[:n], true, err
	}
	return b, false, err
}

// RetryAfter parses a Retry-After header: seconds, or an HTTP date. Zero when absent or unreadable; capped at
// an hour, so a destination cannot park an effect for days.
func RetryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	var d time.Duration
	if strings.Trim(h, "0123456789") == "" {
		// delay-seconds is digits alone (RFC 9110): no sign, no fraction. Past an hour, however many digits,
		// it is the cap; multiplied out first, a large one wrapped round to no pause, or to a short one.
		secs, err := strconv.ParseUint(h, 10, 64)
		if err != nil || secs > uint64(time.Hour/time.Second) {
			return time.Hour
		}
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = t.Sub(now)
	}
	return max(0, min(d, time.Hour))
}

// Classify turns an HTTP answer into an outcome: 2xx delivered; 408, 429 and 5xx retried (honouring
// Retry-After; a 429 or 503 with one is Throttled, a pause of the destination for the fleet); any other status, 3xx included since redirects are not followed, failed for good from a
// destination that is up. result is kept with the outcome.
func Classify(status int, header http.Header, result any) providers.Outcome {
	switch {
	case status >= 200 && status < 300:
		return providers.Delivered(result)
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500:
		o := providers.RetryAfter(RetryAfter(header.Get("Retry-After"), time.Now()),
			fmt.Errorf("destination answered %d %s", status, http.StatusText(status)))
		if o.RetryAfter > 0 && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) {
			o.Throttled = status
		}
		o.Result = providers.Delivered(result).Result
		return o
	default:
		o := providers.Failed(fmt.Errorf("destination answered %d %s", status, http.StatusText(status)), true)
		o.Result = providers.Delivered(result).Result
		return o
	}
}

// Origin names u by scheme and host (with its port): never its user info, path or query.
func Origin(u *url.URL) string {
	return u.Scheme + "://" + u.Host
}

// Destination names the server u reaches, one way for every spelling of it: scheme, host and port, the
// scheme and host lowercased, a DNS name without its final dot, an IP address in its canonical form (an
// IPv4-mapped IPv6 address as the IPv4 one), and the port as a plain number, the scheme's default when u
// names none. It is what a fleet-wide delivery limit and a destination's pause are kept by: an outside test
// reached one receiver as 127.0.0.1:19001, [::ffff:127.0.0.1]:19001, 127.0.0.1:019001 and [::ffff:7f00:1]:19001,
// four buckets of 50 a second each, and https://h and https://h:443 were two.
func Destination(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().WithZone("").String()
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	port := u.Port()
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(n, 10)
	} else {
		switch scheme {
		case "https":
			port = "443"
		case "http":
			port = "80"
		}
	}
	if port == "" {
		return scheme + "://" + host
	}
	return scheme + "://" + host + ":" + port
}

// SetIdempotencyKey sets a request's Idempotency-Key, in a spelling net/http's Transport does not look for.
// The Transport takes a request carrying "Idempotency-Key" for idempotent and, when a reused connection fails
// after the request was written and before an answer came, sends it again by itself: two requests at the
// destination for one attempt, and an at_most_once effect resent. A resend is the outbox's to decide (with
// its attempt counted and its outcome recorded), never the HTTP client's. Servers read header names
// case-insensitively (RFC 9110 §5.1), and HTTP/2 sends them lower-case anyway.
func SetIdempotencyKey(h http.Header, key string) {
	h.Del("Idempotency-Key")
	h["idempotency-key"] = []string{key}
}

// NewRequest returns a request for u built from its parts, so that no error of building it can quote the
// URL (http.NewRequest parses a string, and its error holds it all).
func NewRequest(ctx context.Context, method string, u *url.URL, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, "", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	target := *u
	req.URL, req.Host = &target, u.Host
	return req, nil
}

// RequestError is a request that got no answer. It names the request by method and origin only.
type RequestError struct {
	Method string
	Origin string // scheme://host, as Origin returns
	Err    error  // what net/http said, without the URL
}

func (e *RequestError) Error() string { return e.Method + " " + e.Origin + ": " + e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

// redact replaces the *url.Error that Client.Do returns, which holds the request's whole URL (net/http strips
// only a password), with a *RequestError that names its origin. The errors beneath it (a dial, TLS, a
// timeout, a malformed answer) name addresses and hosts, never the path or query.
func redact(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	inner := ue.Err
	for {
		next, ok := inner.(*url.Error)
		if !ok {
			break
		}
		inner = next.Err
	}
	origin := "the destination"
	if u, perr := url.Parse(ue.URL); perr == nil && u.Host != "" {
		origin = Origin(u)
	}
	return &RequestError{Method: ue.Op, Origin: origin, Err: inner}
}

// sentKey is the context key of Track's flag.
type sentKey struct{}

// Track returns ctx with a flag that the request made with it sets once its headers are written to a
// connection: from then on the destination may act on it, whether or not an answer comes back. TransportError
// reads it (MaybeSent). A trace already in ctx (otelhttp's) is kept.
func Track(ctx context.Context) context.Context {
	wrote := new(atomic.Bool)
	ctx = context.WithValue(ctx, sentKey{}, wrote)
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
}

// Wrote reports whether the request of a context from Track had its headers written.
func Wrote(ctx context.Context) bool {
	wrote, ok := ctx.Value(sentKey{}).(*atomic.Bool)
	return ok && wrote.Load()
}

// TransportError turns an error from Client.Do into an outcome: a forbidden address fails for good (no retry
// will make it allowed); a timeout, a refused or reset connection is retried, MaybeSent when ctx (from
// Track, the request's context) says the request had gone out. The outcome's error names the destination
// by origin only (see redact).
func TransportError(ctx context.Context, err error) providers.Outcome {
	err = redact(err)
	if errors.Is(err, ErrForbiddenAddress) {
		return providers.Failed(err, true)
	}
	o := providers.Retry(err)
	if ctx.Err() != nil {
		o = providers.Retry(fmt.Errorf("timed out: %w", err))
	}
	o.MaybeSent = Wrote(ctx)
	return o
}
