package gateway

import (
	"net/http"
	"testing"
)

// The request body is application/json, as openapi.yaml lists it, with parameters or without (a charset only
// if it is UTF-8): another JSON media type (merge-patch, say) means something else, and is a 415 that records
// nothing.
func TestOnlyApplicationJSONIsAccepted(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	for _, ct := range []string{"application/merge-patch+json", "application/problem+json", "application/vnd.api+json",
		"text/json", "application/jsonx", "application/json-patch+json", "",
		// JSON is UTF-8 (RFC 8259 §8.1): a body said to be in another charset is not JSON as sent.
		"application/json; charset=latin1", "application/json; charset=utf-16"} {
		r := h.req("POST", "/v1/effects", acmeKey, analytics("ct"), "Idempotency-Key: ct-refused", "Content-Type: "+ct)
		if r.status != http.StatusUnsupportedMediaType || r.body["type"] != "/problems/unsupported-media-type" {
			t.Errorf("Content-Type %q: %d %s", ct, r.status, r.raw)
		}
	}
	if n := h.count(`SELECT count(*) FROM oncegate_effects`); n != 0 {
		t.Fatalf("%d effects recorded from refused content types", n)
	}
	for i, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"} {
		r := h.req("POST", "/v1/effects", acmeKey, analytics("ct"), "Idempotency-Key: ct-"+string(rune('a'+i)), "Content-Type: "+ct)
		if r.status != http.StatusAccepted && r.status != http.StatusOK {
			t.Errorf("Content-Type %q: %d %s", ct, r.status, r.raw)
		}
	}
}

// Oncegate-Job-Epoch is plain decimal digits, from 1, without sign or leading zeros: "+9" and "09" are not
// spellings of 9 that every proxy, log search or other client would read alike.
func TestJobEpochIsPlainDigits(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	for _, e := range []string{"+9", "-1", "0", "09", "00", "9 9", "9.0", "1e1", "0x9", "９", "9223372036854775808", ""} {
		r := h.req("POST", "/v1/effects", acmeKey, analytics("epoch"), "Idempotency-Key: epoch-refused",
			"Oncegate-Job-Id: job-1", "Oncegate-Job-Epoch: "+e)
		if r.status != http.StatusBadRequest || r.body["field"] != "Oncegate-Job-Epoch" {
			t.Errorf("epoch %q: %d %s", e, r.status, r.raw)
		}
	}
	if n := h.count(`SELECT count(*) FROM oncegate_effects`); n != 0 {
		t.Fatalf("%d effects recorded from refused epochs", n)
	}
	for _, e := range []string{"9", "10", "9223372036854775807"} {
		r := h.req("POST", "/v1/effects", acmeKey, analytics("epoch"), "Idempotency-Key: epoch-"+e,
			"Oncegate-Job-Id: job-1", "Oncegate-Job-Epoch: "+e)
		if r.status != http.StatusAccepted && r.status != http.StatusOK {
			t.Errorf("epoch %q: %d %s", e, r.status, r.raw)
		}
	}
}
