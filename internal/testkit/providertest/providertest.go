// Package providertest is the conformance suite that every provider kind passes, as Watermill runs one pubsub
// suite against every backend: success, transient failure, permanent failure, timeout, and what a resend
// after a crash does. A provider's test supplies a Destination, a real one (an HTTP server, an SMTP server, a
// database) that the suite can make misbehave.
package providertest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/providers"
)

// Behaviour is how the destination answers from now on.
type Behaviour int

const (
	Succeed       Behaviour = iota
	FailTransient           // a failure that a later attempt may not meet (5xx, 4xx reply, missing table)
	FailPermanent           // a refusal that every attempt will meet (4xx, 5xx reply, invalid address)
	Hang                    // no answer at all
)

// Destination is a real destination for one provider kind.
type Destination interface {
	// Provider returns the provider under test, bound to this destination.
	Provider() providers.Provider
	// Deliver performs one attempt as the dispatcher would (inside a committed transaction for a TxProvider).
	Deliver(ctx context.Context, d providers.Delivery) providers.Outcome
	// Set makes the destination behave as b; false when it cannot (the case is skipped).
	Set(b Behaviour) bool
	// Received returns how many times the destination received the effect of d.
	Received(d providers.Delivery) int
	// ValidPayload returns a payload the provider accepts.
	ValidPayload() json.RawMessage
	// InvalidPayloads maps the field a *providers.FieldError must name to a payload that is wrong there.
	InvalidPayloads() map[string]json.RawMessage
}

// Capabilities say what the kind promises.
type Capabilities struct {
	// ExactlyOnce: a resend of a delivered effect does not reach the destination again (a TxProvider).
	ExactlyOnce bool
}

// Exercise runs the suite; newDest returns a fresh destination for each case.
func Exercise(t *testing.T, caps Capabilities, newDest func(t *testing.T) Destination) {
	delivery := func(key string, payload json.RawMessage) providers.Delivery {
		return providers.Delivery{Tenant: "acme", Key: key, Type: "conformance", StableID: effect.NewStableID("acme", key),
			Payload: payload, Attempt: 1, CreatedAt: time.Now().Truncate(time.Second)}
	}
	deliver := func(t *testing.T, dst Destination, d providers.Delivery, timeout time.Duration) providers.Outcome {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return dst.Deliver(ctx, d)
	}

	t.Run("validate", func(t *testing.T) {
		t.Parallel()
		dst := newDest(t)
		if err := dst.Provider().Validate(dst.ValidPayload()); err != nil {
			t.Fatalf("valid payload refused: %v", err)
		}
		for field, p := range dst.InvalidPayloads() {
			err := dst.Provider().Validate(p)
			var fe *providers.FieldError
			if !errors.As(err, &fe) || fe.Field != field {
				t.Errorf("payload %s: error %v, want a FieldError naming %s", p, err, field)
			}
		}
	})

	t.Run("success", func(t *testing.T) {
		t.Parallel()
		dst := newDest(t)
		d := delivery("success", dst.ValidPayload())
		o := deliver(t, dst, d, 10*time.Second)
		if o.Kind != providers.KindDelivered || len(o.Result) == 0 || !json.Valid(o.Result) {
			t.Fatalf("outcome %v (%v), result %s", o.Kind, o.Err, o.Result)
		}
		if n := dst.Received(d); n != 1 {
			t.Fatalf("destination received the effect %d times", n)
		}
	})

	t.Run("transient failure is retried", func(t *testing.T) {
		t.Parallel()
		dst := newDest(t)
		if !dst.Set(FailTransient) {
			t.Skip("the destination cannot fail transiently")
		}
		d := delivery("transient", dst.ValidPayload())
		if o := deliver(t, dst, d, 10*time.Second); o.Kind != providers.KindRetry || o.Err == nil {
			t.Fatalf("outcome %v (%v), want retry", o.Kind, o.Err)
		}
		dst.Set(Succeed)
		if o := deliver(t, dst, d, 10*time.Second); o.Kind != providers.KindDelivered {
			t.Fatalf("after recovery: %v (%v)", o.Kind, o.Err)
		}
		if n := dst.Received(d); n != 1 {
			t.Fatalf("destination holds the effect %d times after a failure and a success", n)
		}
	})

	t.Run("permanent failure is not retried", func(t *testing.T) {
		t.Parallel()
		dst := newDest(t)
		if !dst.Set(FailPermanent) {
			t.Skip("the destination cannot refuse for good")
		}
		o := deliver(t, dst, delivery("permanent", dst.ValidPayload()), 10*time.Second)
		if o.Kind != providers.KindFailed || !o.DestinationUp || o.Err == nil {
			t.Fatalf("outcome %v (up=%v, %v), want failed from a destination that is up", o.Kind, o.DestinationUp, o.Err)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		dst := newDest(t)
		if !dst.Set(Hang) {
			t.Skip("the destination cannot hang")
		}
		start := time.Now()
		o := deliver(t, dst, delivery("timeout", dst.ValidPayload()), 500*time.Millisecond)
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("the attempt ignored its 500ms deadline: %v", took)
		}
		if o.Kind != providers.KindRetry && o.Kind != providers.KindInDoubt {
			t.Fatalf("outcome %v (%v), want retry or in doubt", o.Kind, o.Err)
		}
	})

	t.Run("resend after a crash", func(t *testing.T) {
		t.Parallel()
		dst := newDest(t)
		d := delivery("resent", dst.ValidPayload())
		if o := deliver(t, dst, d, 10*time.Second); o.Kind != providers.KindDelivered {
			t.Fatalf("first attempt: %v (%v)", o.Kind, o.Err)
		}
		// The gateway died before recording the first success: the row is rescued and delivered again.
		d.Attempt, d.Rescued = 2, true
		if o := deliver(t, dst, d, 10*time.Second); o.Kind != providers.KindDelivered {
			t.Fatalf("resend: %v (%v)", o.Kind, o.Err)
		}
		want := 2
		if caps.ExactlyOnce {
			want = 1
		}
		if n := dst.Received(d); n != want {
			t.Fatalf("the destination holds the effect %d times after a resend, want %d (identified by its stable ID)", n, want)
		}
	})
}
