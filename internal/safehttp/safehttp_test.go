package safehttp

import (
	"context"
	"errors"
	"github.com/oncegate/oncegate/internal/reliability"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"
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
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }
