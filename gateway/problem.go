package gateway

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/oncegate/oncegate/dedup"
)

// Problem is an RFC 9457 problem detail. Type is a URI reference naming the kind of problem; the kinds are
// listed in openapi.yaml.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Field names the offending part of the request, as "payload.to[0]" or "type".
	Field string `json:"field,omitempty"`
}

func writeProblem(w http.ResponseWriter, p Problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func problemType(slug string) string { return "/problems/" + slug }

func badRequest(w http.ResponseWriter, field, detail string) {
	writeProblem(w, Problem{Type: problemType("invalid-request"), Title: "Invalid request", Status: 400,
		Detail: detail, Field: field})
}

// storeError answers for an unexpected store error: 503 with Retry-After when the database is unreachable
// (dedup.ErrUnavailable), else a 500 that says no more than that.
func (g *Gateway) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, dedup.ErrUnavailable) {
		g.log.Warn("database unavailable", "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", "1")
		writeProblem(w, Problem{Type: problemType("unavailable"), Title: "Service unavailable", Status: 503,
			Detail: "the database cannot be reached; retry with the same Idempotency-Key: it records the " +
				"effect once, or returns it if the connection failed after it was recorded"})
		return
	}
	g.log.Error("request failed", "path", r.URL.Path, "err", err)
	writeProblem(w, Problem{Type: problemType("internal"), Title: "Internal error", Status: 500,
		Detail: "the request failed; it is safe to retry with the same Idempotency-Key"})
}
