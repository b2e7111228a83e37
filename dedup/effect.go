// Package dedup is the effect store: it owns every write to the key, effect, outbox and paused-type rows
// (oncegate_keys, oncegate_effects, oncegate_outbox, oncegate_paused_types), as typed lifecycle operations, so that the
// effect's state machine (docs/effects.md) is written down in one package. Create records an effect under an
// idempotency key; Claim, Finish and Reschedule move it through delivery under a lease; SendBack (a tenant's
// Retry, an operator's retry or resend), Resolve, SendBackMatching and PauseType/ResumeType are the changes an
// operator makes, which package admin calls inside its audited transaction (Store.WithTx); Purge applies
// retention. internal/testkit/deptest fails when another package's code writes these tables.
//
// Create's guarantee: the primary key of oncegate_keys (tenant, key), the one place a key is unique, decides
// which of any number of concurrent requests with one key creates the effect; every other request, and every
// later one while the key is held, gets the effect the key points at back (a replay) or, if it carried another
// request under the same key, a KeyReusedError. A key is held until its retention, counted from its effect's
// creation (WithRetention), has passed and its effect has been terminal as long; then the next Create claims it again, in
// the same statement, for a new effect with a new stable id, and of concurrent Creates one does
// (docs/storage.md). Every read by key is of the effect the key points at now. The effect and its
// outbox row are written in one statement, so an accepted effect always has an outbox row and a refused one
// has neither. The delivery operations' guarantee: a write under a lease happens only while the lease is the
// row's (ErrLeaseLost otherwise), so of two dispatchers that believe they hold a row, one records an outcome.
//
// CreateLeased records an effect with its outbox row already leased to the caller, which performs it at
// once (the dedup proxy); it is fenced like any claim, so a caller that dies leaves a row the outbox rescues.
// ClaimEffect takes an existing effect's row for such a caller, fenced, when it waited, by the lease of the
// attempt it waited for: a waiter never takes over a row whose awaited attempt ended.
//
// Driver errors are translated here: ErrUnavailable (try again later) and ErrUnstorable (the data is at
// fault) wrap them, so callers never read SQLSTATE codes.
package dedup

import (
	"encoding/json"
	"time"

	"github.com/oncegate/oncegate/effect"
)

// Effect is an effect as stored, and as the API returns it.
type Effect struct {
	ID          int64  `json:"-"`
	Tenant      string `json:"-"`
	Fingerprint []byte `json:"-"`
	Key         string `json:"key"`
	// StableID names this effect to receivers (webhook-id, Message-ID, analytics effect_id): drawn when it
	// was created, so a key used again after retention names a new one.
	StableID      string          `json:"stable_id"`
	Type          string          `json:"type"`
	Status        effect.Status   `json:"status"`
	Attempts      int             `json:"attempts"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	DeliveredAt   *time.Time      `json:"delivered_at"`
	NextAttemptAt *time.Time      `json:"next_attempt_at"`
	LastError     *string         `json:"last_error"`
	Result        json.RawMessage `json:"result"`
	// BodyExpired: the effect's payload and stored answer were kept apart (retention.payloads) and are gone;
	// Result is then nil whatever the effect's status.
	BodyExpired bool `json:"body_expired,omitempty"`
}
