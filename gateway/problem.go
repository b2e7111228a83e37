package gateway

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"

	"github.com/gorilla/mux"
)

// Problem is an RFC 9457 problem detail. Type is a URI reference naming the kind of problem: the path of the
// page that the gateway serves about it (problemPage).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Field names the offending part of the request, as "payload.to[0]" or "type".
	Field string `json:"field,omitempty"`
}

// ProblemKind is one type of problem the gateway answers with. A problem's type and title come only from
// here, so each type has one title wherever it is answered, and each type's URI serves a page (Means, Do).
type ProblemKind struct {
	Slug   string // the type is "/problems/" + Slug
	Status int
	Title  string
	Means  string // what happened, for the page at the type's URI
	Do     string // what a client should do about it
}

// problemsPath is where problem types live: the type URI of a problem is this path and its slug.
const problemsPath = "/problems/"

// Type is the problem's type URI, relative to the gateway.
func (k *ProblemKind) Type() string { return problemsPath + k.Slug }

var (
	probInvalid = &ProblemKind{Slug: "invalid-request", Status: 400, Title: "Invalid request",
		Means: "The request is malformed: the Idempotency-Key header, the JSON body, the effect type, the payload " +
			"for its provider, or a query parameter. The problem's field names the part at fault, and nothing was recorded.",
		Do: "Correct the part the field names. Sending the same request again will be refused the same way."}
	probUnauthorized = &ProblemKind{Slug: "unauthorized", Status: 401, Title: "Unauthorized",
		Means: "The request carries no API key, or one the gateway does not know. It was answered from its " +
			"headers; its body was not read and nothing was recorded.",
		Do: "Send a tenant's API key as Authorization: Bearer <key>."}
	probTypeNotAllowed = &ProblemKind{Slug: "effect-type-not-allowed", Status: 403, Title: "Effect type not allowed",
		Means: "The tenant's effect_types list in the gateway's configuration does not name this effect type. " +
			"Nothing was recorded.",
		Do: "Use one of the types the detail lists, or ask the operator to allow this one for the tenant."}
	probNotFound = &ProblemKind{Slug: "not-found", Status: 404, Title: "Not found",
		Means: "No effect is recorded under this key for this tenant (keys of other tenants are not visible), " +
			"or the path is not part of the API.",
		Do: "Check the key, percent-encoded in the path, and the API key's tenant. A purged key is gone: its " +
			"effect was kept for the configured retention after it finished."}
	probMethodNotAllowed = &ProblemKind{Slug: "method-not-allowed", Status: 405, Title: "Method not allowed",
		Means: "The path exists but does not take this method.",
		Do:    "Use one of the methods in the Allow header."}
	probFenced = &ProblemKind{Slug: "job-fenced", Status: 409, Title: "Job lease superseded",
		Means: "The queue job named by Oncegate-Job-Id (in the queue Oncegate-Job-Queue names) was leased again " +
			"under a newer epoch than Oncegate-Job-Epoch, or a newer job was enqueued under its ID (a later " +
			"Oncegate-Job-Created): this worker lost the job to another, and may not start effects for it.",
		Do: "Stop the handler without retrying. The job's current run performs its effects."}
	probNotRetryable = &ProblemKind{Slug: "not-retryable", Status: 409, Title: "Effect not retryable",
		Means: "Only dead, failed and unknown effects can be sent back to pending; this one is pending, " +
			"delivering or delivered.",
		Do: "Read the effect for its status; a delivered effect is never performed twice on request."}
	probBodyTooLarge = &ProblemKind{Slug: "body-too-large", Status: 413, Title: "Body too large",
		Means: "The request body is over the gateway's limits.max_body. Nothing was recorded.",
		Do:    "Send a smaller payload; large content belongs where the effect can fetch it, not in the request."}
	probUnsupportedMedia = &ProblemKind{Slug: "unsupported-media-type", Status: 415, Title: "Unsupported media type",
		Means: "The request body is not declared as JSON. Nothing was recorded.",
		Do:    "Send the body as Content-Type: application/json."}
	probKeyReused = &ProblemKind{Slug: "idempotency-key-reused", Status: 422, Title: "Idempotency key reused",
		Means: "The Idempotency-Key was first used for another request: a different effect type or payload. " +
			"The first request's effect stands; this one was not recorded.",
		Do: "Use a new key for a new request. A retry must send exactly the same type and payload, so build the " +
			"payload from the job's data alone (no clock, no random values)."}
	probRateLimited = &ProblemKind{Slug: "rate-limited", Status: 429, Title: "Too many requests",
		Means: "The API key's tenant is over its rate of requests or of request-body bytes. The request was " +
			"answered from its headers and nothing was recorded.",
		Do: "Retry after the seconds in Retry-After, with the same Idempotency-Key."}
	probInternal = &ProblemKind{Slug: "internal", Status: 500, Title: "Internal error",
		Means: "The gateway failed to handle the request. Either the effect was recorded with its outbox row, " +
			"or nothing was.",
		Do: "Retry with the same Idempotency-Key: it records the effect once, or returns the one recorded."}
	probUnavailable = &ProblemKind{Slug: "unavailable", Status: 503, Title: "Service unavailable",
		Means: "The gateway cannot reach its database, or the database's schema is not current. Either the " +
			"effect was recorded with its outbox row, or nothing was.",
		Do: "Retry after the seconds in Retry-After, with the same Idempotency-Key: it records the effect once, " +
			"or returns the one recorded."}
)

// The dedup proxy's problems (proxy.go, docs/proxy.md). Each says whether the effect under the key was
// recorded, since that decides what the client's retry gets.
var (
	probInFlight = &ProblemKind{Slug: "request-in-flight", Status: 409, Title: "Request in flight",
		Means: "Another request under this Idempotency-Key (or the gateway's dispatcher) is performing it, and " +
			"did not finish within proxy.in_flight_wait. Nothing was sent to the upstream for this request.",
		Do: "Retry after the seconds in Retry-After with the same key and request: it gets the answer once the " +
			"first has one."}
	probUpstreamUnreachable = &ProblemKind{Slug: "upstream-unreachable", Status: 502, Title: "Upstream unreachable",
		Means: "The proxied request got no answer from the upstream: the connection was refused or broke, or the " +
			"gateway's guard refused the address. For a transient cause the effect waits for a retry " +
			"(pending): it was not answered, so no answer is stored.",
		Do: "Retry with the same Idempotency-Key and request: it is performed again at once, with the same " +
			"Idempotency-Key to the upstream. If you never retry, the gateway's dispatcher does, by the effect " +
			"type's retry policy."}
	probUpstreamTimeout = &ProblemKind{Slug: "upstream-timeout", Status: 504, Title: "Upstream timeout",
		Means: "The upstream did not answer within the effect type's timeout. It may have acted; the effect " +
			"waits for a retry (pending), and every retry carries the same Idempotency-Key to the upstream.",
		Do: "Retry with the same Idempotency-Key and request, or read the effect at /v1/effects/{key}."}
	probBreakerOpen = &ProblemKind{Slug: "upstream-breaker-open", Status: 503, Title: "Upstream breaker open",
		Means: "Recent requests to this upstream failed, and its circuit breaker holds further calls for a " +
			"while. Nothing was sent; the effect waits (pending) and is performed when the breaker lets calls through.",
		Do: "Retry after the seconds in Retry-After with the same Idempotency-Key and request."}
	probDestinationLimited = &ProblemKind{Slug: "upstream-rate-limited", Status: 429, Title: "Upstream rate limit reached",
		Means: "The effect type limits its calls to this upstream for every gateway together (rate), and no " +
			"call was free within a second. Nothing was sent; the effect waits (pending), uncharged, and the " +
			"gateway's dispatcher performs it when its turn comes, if no retry of yours does first.",
		Do: "Retry after the seconds in Retry-After with the same Idempotency-Key and request."}
	probDestinationPaused = &ProblemKind{Slug: "upstream-paused", Status: 503, Title: "Upstream asked to wait",
		Means: "The upstream answered a recent call with 429 or 503 and Retry-After, and every gateway leaves " +
			"it alone until then (or until an operator runs oncegate destination resume). Nothing was sent; the " +
			"effect waits (pending), uncharged, and is performed after the pause.",
		Do: "Retry after the seconds in Retry-After with the same Idempotency-Key and request."}
	probTypePaused = &ProblemKind{Slug: "type-paused", Status: 503, Title: "Effect type paused",
		Means: "An operator paused delivery of this effect type (oncegate type pause), and this request would " +
			"have reached the upstream. Nothing was sent, and nothing new was recorded: a key first seen now is " +
			"still free, and a key that waits for a retry still waits. Stored answers are still replayed.",
		Do: "Retry after the seconds in Retry-After with the same Idempotency-Key and request; it is performed " +
			"once the type is resumed."}
	probAnswerTooLarge = &ProblemKind{Slug: "answer-too-large", Status: 502, Title: "Answer too large to store",
		Means: "The upstream performed the request, but its answer's body was over the effect type's " +
			"http.max_answer, so it was not stored; the effect keeps the status and headers. Every request under " +
			"this key gets this problem, so that no two get different answers.",
		Do: "Raise http.max_answer for the effect type, or read the resource from the upstream (a GET through " +
			"the proxy is not recorded). Do not retry under a new key: the upstream acted."}
	probOutcomeUnknown = &ProblemKind{Slug: "outcome-unknown", Status: 502, Title: "Outcome unknown",
		Means: "The gateway performing this request died before it recorded the upstream's answer, and the " +
			"effect type's on_crash is at_most_once: the request may or may not have reached the upstream, and " +
			"was not resent. The effect is unknown until an operator resolves it.",
		Do: "Check the upstream; an operator retries the effect (POST /v1/effects/{key}/retry) or leaves it."}
	probAnswerExpired = &ProblemKind{Slug: "answer-expired", Status: 410, Title: "Stored answer expired",
		Means: "The upstream performed this request, but longer ago than the gateway keeps answers " +
			"(retention.payloads): its stored answer is gone, while the key still holds the request as done " +
			"(until retention.keys), so it is not performed again. The detail says what became of it.",
		Do: "Do not retry under a new key: the upstream acted. Read the resource from the upstream."}
	probGaveUp = &ProblemKind{Slug: "upstream-gave-up", Status: 502, Title: "Upstream failed; retries used up",
		Means: "The proxied request failed transiently on every attempt up to the effect type's max_attempts, " +
			"and the effect is dead. The detail has the last error.",
		Do: "Fix the upstream, then an operator retries the effect (POST /v1/effects/{key}/retry)."}
)

// problemKinds lists every problem type the gateway answers with; writeProblem takes nothing else.
var problemKinds = []*ProblemKind{probInvalid, probUnauthorized, probTypeNotAllowed, probNotFound,
	probMethodNotAllowed, probFenced, probNotRetryable, probBodyTooLarge, probUnsupportedMedia, probKeyReused,
	probRateLimited, probInternal, probUnavailable, probInFlight, probUpstreamUnreachable, probUpstreamTimeout,
	probBreakerOpen, probDestinationLimited, probDestinationPaused, probTypePaused, probAnswerTooLarge, probOutcomeUnknown, probGaveUp, probAnswerExpired}

// ProblemKinds returns every problem type the gateway can answer with.
func ProblemKinds() []ProblemKind {
	out := make([]ProblemKind, len(problemKinds))
	for i, k := range problemKinds {
		out[i] = *k
	}
	return out
}

func problemKindOf(slug string) *ProblemKind {
	for _, k := range problemKinds {
		if k.Slug == slug {
			return k
		}
	}
	return nil
}

// writeProblem answers with a problem of kind k; field names the part of the request at fault, if one is.
func writeProblem(w http.ResponseWriter, k *ProblemKind, field, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(k.Status)
	_ = json.NewEncoder(w).Encode(Problem{Type: k.Type(), Title: k.Title, Status: k.Status, Detail: detail, Field: field})
}

//go:embed problem.html
var problemHTML string

var problemPageTemplate = template.Must(template.New("problem").Parse(problemHTML))

// problemPage serves the page at a problem type's URI: what the problem means and what to do about it.
func problemPage(w http.ResponseWriter, r *http.Request) {
	k := problemKindOf(mux.Vars(r)["name"])
	if k == nil {
		writeProblem(w, probNotFound, "", "no such problem type")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = problemPageTemplate.Execute(w, k)
}
