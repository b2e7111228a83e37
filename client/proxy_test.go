package client

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// ProxyTransport adds the key on every request and leaves the caller's request as it was.
func TestProxyTransportAddsTheKey(t *testing.T) {
	t.Parallel()
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header }))
	defer srv.Close()
	c := &http.Client{Transport: ProxyTransport(ProxyKeyHeader, "tenant-key", nil)}
	req, _ := http.NewRequest("POST", srv.URL, nil)
	req.Header.Set("Authorization", "Bearer sdk-owned")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := <-got
	if h.Get(ProxyKeyHeader) != "tenant-key" || h.Get("Authorization") != "Bearer sdk-owned" {
		t.Fatalf("sent %v", h)
	}
	if req.Header.Get(ProxyKeyHeader) != "" {
		t.Fatal("the caller's request was changed")
	}
}
