package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// Text Postgres cannot hold (a NUL, bytes that are not UTF-8) is bad input naming its field, never an
// internal error carrying the database's message.
func TestTextPostgresCannotHoldIsInvalid(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "k", 1, effect.StatusDead)
	field := func(err error) string {
		var ie *admin.InvalidError
		if errors.As(err, &ie) {
			return ie.Field
		}
		return "not invalid: " + errOrNil(err)
	}
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"tenant NUL": {err2(svc.Effects(ctx, viv, admin.EffectFilter{Tenant: "\x00"}, admin.Page{})), "tenant"},
		"prefix bad UTF-8": {err2(svc.Effects(ctx, viv, admin.EffectFilter{KeyPrefix: "\xff"}, admin.Page{})),
			"key_prefix"},
		"job NUL":        {err2(svc.Effects(ctx, viv, admin.EffectFilter{JobID: "j\x00"}, admin.Page{})), "job"},
		"key bad UTF-8":  {err2(svc.Effect(ctx, viv, "acme", "\xff")), "key"},
		"tenant of show": {err2(svc.Effect(ctx, viv, "a\x00", "k0")), "tenant"},
		"reason NUL":     {err2(svc.RetryEffect(ctx, alice, "acme", "k0", "x\x00")), "reason"},
		"operator NUL": {err2(svc.RetryEffect(ctx, admin.Actor{Name: "ev\x00", Role: admin.RoleOperator}, "acme",
			"k0", "x")), "operator"},
		"blank operator": {err2(svc.RetryEffect(ctx, admin.Actor{Name: "   ", Role: admin.RoleOperator}, "acme",
			"k0", "x")), "operator"},
		"audit actor": {err2(svc.AuditLog(ctx, viv, admin.AuditFilter{Actor: "\x00"}, admin.Page{})), "actor"},
		"trace id":    {err2(svc.EffectsByTrace(ctx, viv, "\xff", 10)), "trace_id"},
	} {
		if got := field(tc.err); got != tc.want {
			t.Errorf("%s: field %q, want %q", name, got, tc.want)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'dead'"); n != 1 {
		t.Fatalf("a refused retry changed the effect")
	}
}

func err2[T any](_ T, err error) error { return err }

func errOrNil(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// A reason is bounded: a change with a reason over MaxReason is refused, and a denied change (whose entry
// is written before its reason is read) stores at most MaxReason bytes of it. An outside test stored a
// 1.5 MB reason with each refused attempt.
func TestReasonsAreBounded(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "u", 1, effect.StatusDead)
	huge := strings.Repeat("é", 750_000) // 1.5 MB
	if _, err := svc.RetryEffect(ctx, alice, "acme", "u0", huge); !errors.Is(err, admin.ErrInvalid) {
		t.Fatalf("a 1.5 MB reason: %v", err)
	}
	if _, err := svc.RetryEffect(ctx, viv, "acme", "u0", huge); !errors.Is(err, admin.ErrForbidden) {
		t.Fatalf("a viewer's change: %v", err)
	}
	if n := pgtest.Count(t, pool, "SELECT max(octet_length(reason)) FROM oncegate_audit"); n > admin.MaxReason {
		t.Fatalf("an audit entry holds a reason of %d bytes", n)
	}
	if _, err := svc.RetryEffect(ctx, alice, "acme", "u0", strings.Repeat("é", admin.MaxReason/2)); err != nil {
		t.Fatalf("a reason of MaxReason bytes: %v", err)
	}
}
