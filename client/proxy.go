package client

import "net/http"

// ProxyKeyHeader is the header the README's configuration names in the gateway's proxy.api_key_header, for
// SDKs that own Authorization.
const ProxyKeyHeader = "Oncegate-Api-Key"

// ProxyTransport returns a RoundTripper that sends the tenant's API key in header (the gateway's
// proxy.api_key_header; ProxyKeyHeader in the docs) on every request, and then next (http.DefaultTransport
// when nil). It is for another API's SDK pointed at the gateway's dedup proxy (/v1/proxy/{type}): the SDK
// keeps its own Authorization, which the gateway never sends on (the upstream's credentials are the effect
// type's configured headers), and its own Idempotency-Key.
func ProxyTransport(header, apiKey string, next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return keyTransport{header: header, key: apiKey, next: next}
}

type keyTransport struct {
	header, key string
	next        http.RoundTripper
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the request it is given.
	r = r.Clone(r.Context())
	r.Header.Set(k.header, k.key)
	return k.next.RoundTrip(r)
}
