// Package providers defines what a provider is: the code that performs one kind of external effect (send an
// email, post a webhook, insert an analytics row, call an HTTP API) for the gateway's dispatcher. Each kind
// lives in its own subpackage and is bound to effect types by the gateway's configuration.
//
// A provider says what should happen next through the Outcome it returns: delivered (with a small result),
// retry (optionally after a delay), failed for good, or in doubt. The dispatcher owns everything else:
// leases, attempts, backoff, circuit breakers, and recording the outcome under a fence.
//
// The guarantee a provider adds is about the crash window, the moment between the provider's success and the
// commit that records it: a provider that implements TxProvider closes it entirely (its effect commits with
// the record), the others make a resend recognisable to the receiver through Delivery.StableID.
package providers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Delivery is one attempt to perform an effect.
type Delivery struct {
	Tenant string
	Key    string // the client's idempotency key; never forwarded to a shared receiver (see StableID)
	Type   string
	// StableID names the effect for receivers, the same on every attempt and rescue of this effect, and new
	// for a new effect under a key that retention freed (effect.NewStableID). Two tenants' "k1" never collide
	// at a shared receiver, and the raw client key is never sent.
	StableID string
	Payload  json.RawMessage
	// Attempt is 1-based.
	Attempt int
	// Rescued is set when an earlier attempt's gateway died while delivering: that attempt may have reached
	// the destination.
	Rescued bool
	// CreatedAt is when the effect was first requested: the same on every attempt.
	CreatedAt time.Time
}

// Provider performs effects of one kind.
type Provider interface {
	// Validate checks a payload when the effect is requested, so that a bad payload is a 400 at once rather
	// than a failed delivery later. Errors should be *FieldError.
	Validate(payload json.RawMessage) error
	// Deliver performs the effect once. ctx carries the effect type's timeout.
	Deliver(ctx context.Context, d Delivery) Outcome
}

// Router is a provider that can say, before it is called, where a delivery goes: the dispatcher keeps one
// circuit breaker per destination (and tenant), so that one failing endpoint never holds back deliveries to
// the others. A destination is a host name (with its port when one is given), never a URL: it is shown in
// metrics and logs, where a configured URL's path, query and user info must not appear.
//
// A provider that is not a Router has one destination, DefaultDestination.
type Router interface {
	Provider
	// Destination names where a delivery of payload goes. It must not fail: a payload it cannot read names
	// the provider's default destination (Deliver refuses such a payload anyway).
	Destination(payload json.RawMessage) string
}

// Addressee is a provider whose payloads name people or systems an operator would search by: an email's
// recipients. The gateway stores them as search terms beside the effect's tags (effect.SearchTerms), so that
// `oncegate effect ls --search carol@example.test` finds the emails sent to her without a key.
type Addressee interface {
	Provider
	// Recipients lists the payload's addressees as plain addresses. It must not fail: a payload it cannot
	// read has none (Validate refuses it anyway).
	Recipients(payload json.RawMessage) []string
}

// Recipients returns p's addressees of payload, when p is an Addressee.
func Recipients(p Provider, payload json.RawMessage) []string {
	if a, ok := p.(Addressee); ok {
		return a.Recipients(payload)
	}
	return nil
}

// DefaultDestination is the destination of a provider that is not a Router.
const DefaultDestination = "*"

// MaxDestination bounds the length of a destination's name.
const MaxDestination = 255

// Destination returns where p delivers payload: its Router answer, cut to MaxDestination bytes, or
// DefaultDestination.
func Destination(p Provider, payload json.RawMessage) string {
	r, ok := p.(Router)
	if !ok {
		return DefaultDestination
	}
	d := r.Destination(payload)
	if d == "" {
		return DefaultDestination
	}
	if len(d) > MaxDestination {
		d = d[:MaxDestination]
	}
	return d
}

// TxProvider performs its effect inside the database transaction in which the dispatcher records the
// outcome: both commit, or neither. Such a provider has no crash window.
type TxProvider interface {
	Provider
	DeliverTx(ctx context.Context, tx pgx.Tx, d Delivery) Outcome
}

// BatchTxProvider is a TxProvider that performs many effects in one statement of the transaction in which
// the dispatcher records all their outcomes: one commit for a claim's worth of effects instead of one each
// (issue 14). The dispatcher has locked the rows of every delivery it passes, so all of them are its to record.
type BatchTxProvider interface {
	TxProvider
	// DeliverTxBatch returns an outcome per delivery, in order: delivered for each effect it performed in tx,
	// failed for one it refused without a statement (an invalid payload). An error means the statement failed
	// and tx is unusable: the dispatcher rolls back and delivers each row alone with DeliverTx, so that a row
	// at fault fails by itself and never holds back the others.
	DeliverTxBatch(ctx context.Context, tx pgx.Tx, ds []Delivery) ([]Outcome, error)
}

// Querier runs a query on the gateway's database: a pool or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Checker is a provider whose destination can be checked before the gateway serves: a setup that would fail
// every delivery (a table without the constraint the provider's guarantee rests on) stops the start, saying
// what to fix, rather than sending every effect of its type to dead letters.
type Checker interface {
	Provider
	// Check returns nil, an error saying what to fix, or an error wrapping ErrCannotCheck when the check
	// itself could not run (the database is down): the gateway then starts, as it does without a database.
	Check(ctx context.Context, db Querier) error
}

// ErrCannotCheck is wrapped by a Checker's error when the check could not run.
var ErrCannotCheck = errors.New("the destination could not be checked")

// OutcomeKind says what happens after an attempt.
type OutcomeKind int

const (
	// KindDelivered: the effect happened; Result is kept and replayed.
	KindDelivered OutcomeKind = iota + 1
	// KindRetry: a transient failure (timeout, 5xx, 429, SMTP 4xx, connection error); try again after
	// backoff, or after RetryAfter when set.
	KindRetry
	// KindFailed: a permanent failure (4xx other than 408/429, SMTP 5xx, invalid address); no retry.
	KindFailed
	// KindInDoubt: the effect may or may not have happened, and resending is not safe; an operator decides.
	KindInDoubt
)

func (k OutcomeKind) String() string {
	switch k {
	case KindDelivered:
		return "delivered"
	case KindRetry:
		return "retry"
	case KindFailed:
		return "failed"
	case KindInDoubt:
		return "in_doubt"
	}
	return fmt.Sprintf("OutcomeKind(%d)", int(k))
}

// Outcome is what a provider's attempt came to.
type Outcome struct {
	Kind       OutcomeKind
	Result     json.RawMessage // for KindDelivered (and what a destination answered, when useful)
	RetryAfter time.Duration   // for KindRetry: the destination asked for this delay
	Err        error           // why, for every kind but KindDelivered
	// DestinationUp is set with KindFailed when the destination answered (a 4xx): it is up, and the circuit
	// breaker counts the attempt as a success.
	DestinationUp bool
	// MaybeSent is set with KindRetry when the request went out and its answer never came (a timeout, a
	// connection lost after the request was written, an answer that broke off): the destination may have
	// acted on it. A resend is then a duplicate to a destination that does not deduplicate, so an effect type
	// with on_crash: at_most_once finishes such an attempt unknown, as it does an attempt a crash cut short.
	MaybeSent bool
	// Throttled is set with KindRetry and RetryAfter when the destination itself asked for the time: the
	// HTTP status (429 or 503) that came with its Retry-After. The dispatcher then pauses that destination
	// for every gateway for RetryAfter, and the answer is no breaker failure.
	Throttled int
}

// Delivered returns a delivered outcome with result encoded as JSON (without HTML escaping: results are
// stored and replayed as they are, "<id@host>" included).
func Delivered(result any) Outcome {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(result); err != nil {
		return Outcome{Kind: KindFailed, Err: fmt.Errorf("encode result: %w", err)}
	}
	return Outcome{Kind: KindDelivered, Result: bytes.TrimSuffix(b.Bytes(), []byte("\n"))}
}

// Retry returns a transient failure.
func Retry(err error) Outcome { return Outcome{Kind: KindRetry, Err: err} }

// RetryAfter returns a transient failure whose destination asked to wait d.
func RetryAfter(d time.Duration, err error) Outcome {
	return Outcome{Kind: KindRetry, RetryAfter: d, Err: err}
}

// Failed returns a permanent failure. destinationUp tells the breaker the destination answered.
func Failed(err error, destinationUp bool) Outcome {
	return Outcome{Kind: KindFailed, Err: err, DestinationUp: destinationUp}
}

// InDoubt returns an outcome that needs an operator.
func InDoubt(err error) Outcome { return Outcome{Kind: KindInDoubt, Err: err} }

// FieldError is a payload that is invalid for its provider, naming the field, as "payload.to[1]".
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Invalid returns a *FieldError for a field of the payload.
func Invalid(field, format string, args ...any) error {
	if field == "" {
		field = "payload"
	} else {
		field = "payload." + field
	}
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// DecodeStrict decodes a payload into v, refusing unknown fields and trailing data, and turning the decoder's
// errors into *FieldError.
func DecodeStrict(payload json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return Invalid(typeErr.Field, "must be %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return Invalid(name, "unknown field")
		default:
			return Invalid("", "%v", err)
		}
	}
	if dec.More() {
		return Invalid("", "unexpected data after the payload object")
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "a number"
}
