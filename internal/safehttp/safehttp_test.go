package safehttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
)

func TestForbiddenAddresses(t *testing.T) {
	for _, a := range []string{
		"127.0.0.1", "127.9.9.9", "::1", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "fe80::1", "100.64.0.1", "100.127.255.255", "fc00::1", "fd00:ec2::254", "0.0.0.0",
		"::", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "224.0.0.1", "255.255.255.255",
		"198.18.0.1",
	} {
		if !Forbidden(netip.MustParseAddr(a)) {
			t.Errorf("%s allowed", a)
		}
	}
	for _, a := range []string{"93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "172.32.0.1", "100.128.0.1", "::ffff:8.8.8.8"} {
		if Forbidden(netip.MustParseAddr(a)) {
			t.Errorf("%s forbidden", a)
		}
	}
}

// The guard runs at dial time: a loopback server is unreachable, whatever name or form the URL uses.
func TestClientRefusesPrivateDestinationsAtDialTime(t *testing.T) {
	result := reliability.Record(t, "SSRF", "Requests to loopback by IP, by name, IPv6 and IPv4-mapped forms", "Refused at dial time (after DNS), failed for good")
	result("all refused: ErrForbiddenAddress")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	defer srv.Close()
	port := srv.Listener.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort().Port()
	for _, u := range []string{
		srv.URL,
		"http://localhost:" + itoa(port),
		"http://[::ffff:127.0.0.1]:" + itoa(port),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		resp, err := Client(false).Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s reached the loopback server", u)
			continue
		}
		if !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("%s: %v, want ErrForbiddenAddress", u, err)
		}
		if o := TransportError(ctx, err); o.Kind.String() != "failed" {
			t.Errorf("%s: outcome %s, want failed: no retry makes a forbidden address allowed", u, o.Kind)
		}
	}
	resp, err := Client(true).Get(srv.URL)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("with private networks allowed: %v", err)
	}
	resp.Body.Close()
}

func TestRetryAfterAndClassify(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if d := RetryAfter("120", now); d != 2*time.Minute {
		t.Errorf("seconds: %v", d)
	}
	if d := RetryAfter(now.Add(30*time.Second).Format(http.TimeFormat), now); d != 30*time.Second {
		t.Errorf("date: %v", d)
	}
	if d := RetryAfter("999999", now); d != time.Hour {
		t.Errorf("cap: %v", d)
	}
	if d := RetryAfter("soon", now); d != 0 {
		t.Errorf("junk: %v", d)
	}
	// Seconds past what a Duration holds are capped too, not wrapped round (an outside test's 9999999999 made
	// no pause at all, and 18446744074 one of 0.29 s); a sign or a fraction is not delay-seconds (RFC 9110).
	for h, want := range map[string]time.Duration{"9999999999": time.Hour, "18446744074": time.Hour,
		"99999999999999999999999": time.Hour, "+5": 0, "-5": 0, "5.5": 0, " 5": 0, "0": 0} {
		if d := RetryAfter(h, now); d != want {
			t.Errorf("Retry-After %q: %v, want %v", h, d, want)
		}
	}
	for status, want := range map[int]string{200: "delivered", 204: "delivered", 301: "failed", 400: "failed",
		404: "failed", 408: "retry", 410: "failed", 422: "failed", 429: "retry", 500: "retry", 503: "retry"} {
		if got := Classify(status, http.Header{}, nil).Kind.String(); got != want {
			t.Errorf("%d: %s, want %s", status, got, want)
		}
	}
	o := Classify(429, http.Header{"Retry-After": {"7"}}, nil)
	if o.RetryAfter != 7*time.Second {
		t.Errorf("429 Retry-After: %v", o.RetryAfter)
	}
	// A 429 or 503 whose Retry-After can be read asks the fleet to pause the destination (issue 31); the
	// same header on another status, or a 429 without one, is a retry of that effect only.
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, c := range []struct {
		status    int
		after     string
		throttled int
	}{
		{429, "5", 429}, {503, date, 503}, {429, "", 0}, {503, "soon", 0}, {429, "0", 0}, {500, "5", 0}, {408, "5", 0},
	} {
		h := http.Header{}
		if c.after != "" {
			h.Set("Retry-After", c.after)
		}
		if o := Classify(c.status, h, nil); o.Throttled != c.throttled {
			t.Errorf("%d with Retry-After %q: Throttled %d, want %d", c.status, c.after, o.Throttled, c.throttled)
		}
	}
	if o := Classify(503, http.Header{"Retry-After": {date}}, nil); o.RetryAfter < 85*time.Second || o.RetryAfter > 90*time.Second {
		t.Errorf("503 with an HTTP date 90 s ahead: RetryAfter %v", o.RetryAfter)
	}
}

// IPv6 addresses that carry an IPv4 address reach that IPv4 address through a translator or a tunnel (NAT64,
// 6to4, Teredo), or are deprecated forms no public destination uses (IPv4-compatible, SIIT, site-local): each
// is judged as the IPv4 address it reaches, or refused.
func TestForbiddenEmbeddedIPv4(t *testing.T) {
	for _, c := range []struct{ addr, why string }{
		{"64:ff9b::7f00:1", "NAT64 of 127.0.0.1"},
		{"64:ff9b::a9fe:a9fe", "NAT64 of the metadata address"},
		{"64:ff9b::10.1.2.3", "NAT64 of 10.1.2.3"},
		{"64:ff9b::192.168.0.1", "NAT64 of 192.168.0.1"},
		{"64:ff9b::100.64.0.1", "NAT64 of CGNAT"},
		{"64:ff9b::ffff:ffff", "NAT64 of broadcast"},
		{"64:ff9b:1::a9fe:a9fe", "local-use NAT64 (RFC 8215)"},
		{"2002:7f00:1::1", "6to4 of 127.0.0.1"},
		{"2002:a9fe:a9fe::1", "6to4 of the metadata address"},
		{"2002:a00:1:1234::1", "6to4 of 10.0.0.1"},
		{"2002:c0a8:101::", "6to4 of 192.168.1.1"},
		{"::7f00:1", "IPv4-compatible 127.0.0.1"},
		{"::a9fe:a9fe", "IPv4-compatible metadata address"},
		{"::808:808", "IPv4-compatible, deprecated: refused whatever it carries"},
		{"::ffff:0:7f00:1", "SIIT translated 127.0.0.1"},
		{"::ffff:0:a9fe:a9fe", "SIIT translated metadata address"},
		{"::ffff:0:808:808", "SIIT translated, obsolete: refused whatever it carries"},
		{"fec0::1", "site-local, deprecated"},
		{"feff:ffff::1", "site-local, top of the range"},
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo client 127.0.0.1"},
		{"2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo client 10.0.0.1"},
		{"2001:0:4136:e378:8000:63bf:5601:5601", "Teredo client 169.254.169.254"},
		{"2001:0:a00:1:8000:63bf:f7f7:f7f7", "Teredo server 10.0.0.1"},
		{"2001:0:a9fe:a9fe:8000:63bf:f7f7:f7f7", "Teredo server 169.254.169.254"},
	} {
		if !Forbidden(netip.MustParseAddr(c.addr)) {
			t.Errorf("%s (%s) allowed", c.addr, c.why)
		}
	}
	for _, c := range []struct{ addr, why string }{
		{"64:ff9b::808:808", "NAT64 of a public address: how an IPv6-only network reaches it"},
		{"64:ff9b::5db8:d822", "NAT64 of 93.184.216.34"},
		{"2002:808:808::1", "6to4 of a public address"},
		{"2001:0:4136:e378:8000:63bf:f7f7:f7f7", "Teredo, public server and client 8.8.8.8"},
		{"2001:db9::1", "near Teredo, not Teredo"},
		{"2001:4860:4860::8888", "a public IPv6 address under 2001::/16"},
		{"fe00::1", "below site-local, above ULA: global unicast space"},
	} {
		if Forbidden(netip.MustParseAddr(c.addr)) {
			t.Errorf("%s (%s) forbidden", c.addr, c.why)
		}
	}
}

// The refusal of embedded forms happens at dial time, in the dialer the client connects with, after name
// resolution. The test's dialer stops every dial the guard lets through before it connects, so that no
// packet leaves for these addresses even if the guard were broken: a dial that reaches it fails the test.
func TestClientRefusesEmbeddedIPv4AtDialTime(t *testing.T) {
	result := reliability.Record(t, "SSRF", "Requests to NAT64, 6to4, Teredo, IPv4-compatible, SIIT and site-local IPv6 addresses embedding loopback, private or metadata IPv4",
		"Refused at dial time (after DNS), failed for good; nothing connects")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	defer srv.Close()
	port := itoa(srv.Listener.Addr().(interface{ AddrPort() netip.AddrPort }).AddrPort().Port())
	var reached []string
	c := client(false, func(_, address string, _ syscall.RawConn) error {
		reached = append(reached, address)
		return fmt.Errorf("test: the dial to %s passed the guard", address)
	})
	defer c.CloseIdleConnections()
	hosts := []string{"[64:ff9b::7f00:1]", "[64:ff9b::a9fe:a9fe]", "[2002:7f00:1::1]", "[2002:a9fe:a9fe::]",
		"[::7f00:1]", "[::ffff:0:7f00:1]", "[fec0::1]", "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
		"[2001:0:4136:e378:8000:63bf:5601:5601]"}
	for _, h := range hosts {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+h+":"+port+"/", nil)
		resp, err := c.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s answered", h)
			continue
		}
		if !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("%s: %v, want ErrForbiddenAddress from the dialer", h, err)
		}
		if o := TransportError(ctx, err); o.Kind.String() != "failed" {
			t.Errorf("%s: outcome %s, want failed", h, o.Kind)
		}
	}
	if len(reached) != 0 {
		t.Fatalf("dials passed the guard: %v", reached)
	}
	// The same client, its guard aside, does dial: a public-looking IPv6 address reaches the test's stop.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://[64:ff9b::808:808]:"+port+"/", nil)
	if _, err := c.Do(req); err == nil || !strings.Contains(err.Error(), "passed the guard") || len(reached) != 1 {
		t.Fatalf("a public NAT64 address: %v, dials %v; want it to reach the dialer", err, reached)
	}
	result(fmt.Sprintf("%d/%d refused by the dialer, 0 connected", len(hosts), len(hosts)))
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// A destination is named one way however its URL spells it, so that a fleet-wide limit or a pause cannot be
// slipped by writing the same server another way.
func TestDestinationIsOneNameForEverySpelling(t *testing.T) {
	for want, spellings := range map[string][]string{
		"http://127.0.0.1:19001": {"http://127.0.0.1:19001/a", "http://[::ffff:127.0.0.1]:19001/b",
			"http://127.0.0.1:019001/c", "http://[::ffff:7f00:1]:19001/f", "HTTP://127.0.0.1:19001"},
		"https://api.example.com:443": {"https://api.example.com/x", "https://API.Example.com:443/y",
			"https://api.example.com.:0443/z"},
		"http://[2001:db8::1]:80":      {"http://[2001:db8::1]/", "http://[2001:DB8:0::1]:80/"},
		"https://api.example.com:8443": {"https://api.example.com:8443/v1"},
	} {
		for _, s := range spellings {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			if got := Destination(u); got != want {
				t.Errorf("Destination(%s) = %s, want %s", s, got, want)
			}
		}
	}
	u, _ := url.Parse("http://a.example:80/")
	v, _ := url.Parse("https://a.example:80/")
	if Destination(u) == Destination(v) {
		t.Errorf("http and https to one host and port are two destinations: %s", Destination(u))
	}
}
