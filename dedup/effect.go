// Package dedup records effects under idempotency keys. A Postgres unique constraint on (tenant, key) decides
// which of any number of concurrent requests with one key creates the effect; every other request, and every
// later one, gets the stored effect back (a replay) or, if it carried another request under the same key, a
// KeyReusedError. The effect and its outbox row are written in one statement, so an accepted effect always
// has an outbox row and a refused one has neither.
package dedup

import (
	"encoding/json"
	"time"
)

// Status is where an effect is in its life; the values are those of the database column.
type Status string

const (
	StatusPending    Status = "pending"    // in the outbox, waiting for a dispatcher
	StatusDelivering Status = "delivering" // a dispatcher holds its lease
	StatusDelivered  Status = "delivered"
	StatusFailed     Status = "failed" // the provider refused it for good
	StatusDead       Status = "dead"   // retries used up
	StatusUnknown    Status = "unknown"
)

// Statuses lists every status.
func Statuses() []Status {
	return []Status{StatusPending, StatusDelivering, StatusDelivered, StatusFailed, StatusDead, StatusUnknown}
}

// Terminal reports whether the effect will not change without an operator.
func (s Status) Terminal() bool {
	return s == StatusDelivered || s == StatusFailed || s == StatusDead || s == StatusUnknown
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

// Effect is an effect as stored, and as the API returns it.
type Effect struct {
	ID            int64           `json:"-"`
	Tenant        string          `json:"-"`
	Fingerprint   []byte          `json:"-"`
	Key           string          `json:"key"`
	Type          string          `json:"type"`
	Status        Status          `json:"status"`
	Attempts      int             `json:"attempts"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	DeliveredAt   *time.Time      `json:"delivered_at"`
	NextAttemptAt *time.Time      `json:"next_attempt_at"`
	LastError     *string         `json:"last_error"`
	Result        json.RawMessage `json:"result"`
}
