// Package effect holds the small types that the gateway's store and the Go client share, so that both name an
// effect's status with one type without the client importing pgx or the store (as River's rivertype does). It
// has no dependencies and never will: anything that needs one belongs in dedup or outbox.
//
// The state machine these statuses form, and who moves an effect along it, is in docs/effects.md.
package effect

import "net/url"

// Status is where an effect is in its life. The values are those of the database column
// oncegate_effects.status (its CHECK constraint lists them) and of the API's "status" field.
type Status string

const (
	StatusPending    Status = "pending"    // in the outbox, waiting for a dispatcher
	StatusDelivering Status = "delivering" // a dispatcher holds its lease
	StatusDelivered  Status = "delivered"  // the provider performed it
	StatusFailed     Status = "failed"     // the provider refused it for good
	StatusDead       Status = "dead"       // retries used up
	StatusUnknown    Status = "unknown"    // it may or may not have happened: an operator decides
)

// Statuses lists every status, in the order of the effect's life.
func Statuses() []Status {
	return []Status{StatusPending, StatusDelivering, StatusDelivered, StatusFailed, StatusDead, StatusUnknown}
}

// RetryableStatuses lists the statuses an operator's retry sends back to pending: the terminal ones but
// delivered, which must never be performed twice on request.
func RetryableStatuses() []Status { return []Status{StatusFailed, StatusDead, StatusUnknown} }

// Terminal reports whether the effect will not change without an operator.
func (s Status) Terminal() bool {
	return s == StatusDelivered || s.Retryable()
}

// Retryable reports whether an operator's retry may send the effect back to pending.
func (s Status) Retryable() bool {
	return s == StatusFailed || s == StatusDead || s == StatusUnknown
}

// Valid reports whether s is one of Statuses.
func (s Status) Valid() bool {
	for _, v := range Statuses() {
		if s == v {
			return true
		}
	}
	return false
}

// Path is the API path of the effect under key, as the gateway's Location spells it and the client asks for
// it: the key path-escaped, and a key that is "." or ".." escaped whole, since a dot segment is removed from
// a path by RFC 3986 clients and proxies (§5.2.4) and refused by the gateway.
func Path(key string) string {
	switch key {
	case ".":
		return "/v1/effects/%2E"
	case "..":
		return "/v1/effects/%2E%2E"
	}
	return "/v1/effects/" + url.PathEscape(key)
}
