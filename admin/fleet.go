package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/safehttp"
	"github.com/oncegate/oncegate/outbox"
)

// Gateway is a gateway instance, from its heartbeat row.
type Gateway struct {
	ID        string    `json:"id"`
	Address   string    `json:"address"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
	// StoppedAt is when its graceful stop began (migration 00031): it may still be finishing the deliveries
	// in flight, but takes no new work. Nil while it runs, and when it was killed.
	StoppedAt *time.Time `json:"stopped_at"`
	// Alive is whether it was seen within Config.GatewayGoneAfter, by the database's clock, and has not stopped.
	Alive    bool                  `json:"alive"`
	Breakers []outbox.BreakerState `json:"breakers"`
	// HeldRequests is, by tenant, the requests it held open in the gateway (waits, proxied waiters, slow
	// bodies) at its last heartbeat; tenants holding none are left out.
	HeldRequests map[string]int `json:"held_requests"`
}

// Held is the gateway's held requests, all tenants together.
func (g Gateway) Held() int {
	n := 0
	for _, v := range g.HeldRequests {
		n += v
	}
	return n
}

// FleetFilter selects the gateways a listing shows.
type FleetFilter struct {
	// All includes the gateways gone for longer than Config.FoldGoneAfter, which are otherwise folded into a
	// count: after a few deploys they would outnumber the live ones, with breakers that hold nothing.
	All bool
}

// Fleet is the gateways a listing shows, and how many gone ones it folded away.
type Fleet struct {
	Gateways []Gateway `json:"gateways"`
	// Folded counts the gateways left out: gone for longer than Config.FoldGoneAfter (within the last day,
	// as the heartbeat table keeps no more).
	Folded int `json:"folded"`
}

// Gateways lists the gateways seen within the last day, live ones and gone ones, newest start first; those
// gone for longer than Config.FoldGoneAfter only with f.All.
func (s *Service) Gateways(ctx context.Context, a Actor, f FleetFilter) (*Fleet, error) {
	if err := s.allow(ctx, a, "gateway.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, gatewaysListSQL)
	if err != nil {
		return nil, dbError("list gateways", err)
	}
	fleet := &Fleet{Gateways: []Gateway{}}
	var now time.Time
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Gateway, error) {
		var g Gateway
		var breakers, held string
		if err := r.Scan(&g.ID, &g.Address, &g.Version, &g.StartedAt, &g.LastSeen, &breakers, &held, &now,
			&g.StoppedAt); err != nil {
			return g, err
		}
		if err := json.Unmarshal([]byte(held), &g.HeldRequests); err != nil {
			return g, fmt.Errorf("gateway %s: held requests: %w", g.ID, err)
		}
		g.Alive = now.Sub(g.LastSeen) <= s.cfg.GatewayGoneAfter && g.StoppedAt == nil
		if err := json.Unmarshal([]byte(breakers), &g.Breakers); err != nil {
			return g, fmt.Errorf("gateway %s: breakers: %w", g.ID, err)
		}
		if g.Breakers == nil {
			g.Breakers = []outbox.BreakerState{}
		}
		return g, nil
	})
	if err != nil {
		return nil, dbError("list gateways", err)
	}
	for _, g := range all {
		if !f.All && now.Sub(g.LastSeen) > s.cfg.FoldGoneAfter {
			fleet.Folded++
			continue
		}
		fleet.Gateways = append(fleet.Gateways, g)
	}
	return fleet, nil
}

// Breaker is one circuit breaker of one gateway.
type Breaker struct {
	Gateway      string `json:"gateway"`
	GatewayAlive bool   `json:"gateway_alive"`
	outbox.BreakerState
}

// MarshalJSON writes every documented field, an absent one as null (a closed breaker's open_until) and an
// idle one's in_flight as 0: the gateway's heartbeat leaves them out to stay small, the CLI's contract does
// not.
func (b Breaker) MarshalJSON() ([]byte, error) {
	orNull := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	return json.Marshal(struct {
		Gateway      string     `json:"gateway"`
		GatewayAlive bool       `json:"gateway_alive"`
		Type         string     `json:"type"`
		Tenant       string     `json:"tenant"`
		Destination  string     `json:"destination"`
		State        string     `json:"state"`
		OpenUntil    *time.Time `json:"open_until"`
		LastUsed     *time.Time `json:"last_used"`
		InFlight     int32      `json:"in_flight"`
	}{b.Gateway, b.GatewayAlive, b.Type, b.Tenant, b.Destination, b.State, orNull(b.OpenUntil),
		orNull(b.LastUsed), b.InFlight})
}

// Breakers lists every circuit breaker of the gateways f shows, from their heartbeats: the fleet's view of
// which destinations are down. A gone gateway's breakers are listed as it last reported them; those of the
// gateways folded away are left out with them.
func (s *Service) Breakers(ctx context.Context, a Actor, f FleetFilter) (*BreakerList, error) {
	fleet, err := s.Gateways(ctx, a, f)
	if err != nil {
		return nil, err
	}
	out := &BreakerList{Breakers: []Breaker{}, Folded: fleet.Folded}
	for _, g := range fleet.Gateways {
		for _, b := range g.Breakers {
			out.Breakers = append(out.Breakers, Breaker{Gateway: g.ID, GatewayAlive: g.Alive, BreakerState: b})
		}
	}
	return out, nil
}

// BreakerList is the breakers a listing shows, and how many gateways it folded away (see Fleet).
type BreakerList struct {
	Breakers []Breaker `json:"breakers"`
	Folded   int       `json:"folded"`
}

// PausedType is an effect type whose delivery an operator paused.
type PausedType struct {
	Type     string    `json:"type"`
	PausedBy string    `json:"paused_by"`
	PausedAt time.Time `json:"paused_at"`
	Reason   string    `json:"reason"`
}

// EffectType is an effect type as an operator sees it: whether it is paused, and how many live gateways
// deliver it (0 for a type only effects still have, after it left every configuration).
type EffectType struct {
	Type     string     `json:"type"`
	Paused   bool       `json:"paused"`
	PausedBy *string    `json:"paused_by"`
	PausedAt *time.Time `json:"paused_at"`
	Reason   *string    `json:"reason"`
	Gateways int        `json:"gateways"`
}

// Types lists every effect type an operator may name: those the gateways seen within the last day deliver
// (their heartbeat writes them), those effects have, and the paused ones.
func (s *Service) Types(ctx context.Context, a Actor) ([]EffectType, error) {
	if err := s.allow(ctx, a, "type.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, typesListSQL, s.cfg.GatewayGoneAfter.Seconds())
	if err != nil {
		return nil, dbError("list effect types", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EffectType, error) {
		var t EffectType
		err := r.Scan(&t.Type, &t.PausedBy, &t.PausedAt, &t.Reason, &t.Gateways)
		t.Paused = t.PausedBy != nil
		return t, err
	})
	if err != nil {
		return nil, dbError("list effect types", err)
	}
	if out == nil {
		out = []EffectType{}
	}
	return out, nil
}

// knownType refuses a type no gateway delivers, no effect has and no pause names: a misspelt type was
// paused before, changing nothing, and the command said it had.
func (s *Service) knownType(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, typ string) error {
	var known bool
	if err := q.QueryRow(ctx, typeKnownSQL, typ).Scan(&known); err != nil {
		return dbError("look the type up", err)
	}
	if known {
		return nil
	}
	return &NotFoundError{What: fmt.Sprintf("effect type %q (no gateway seen in the last day delivers it, no "+
		"effect has it: `oncegate type ls` lists the types)", typ)}
}

// PausedTypes lists the paused effect types.
func (s *Service) PausedTypes(ctx context.Context, a Actor) ([]PausedType, error) {
	if err := s.allow(ctx, a, "type.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, typesPausedSQL)
	if err != nil {
		return nil, dbError("list paused types", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PausedType, error) {
		var p PausedType
		err := r.Scan(&p.Type, &p.PausedBy, &p.PausedAt, &p.Reason)
		return p, err
	})
	if err != nil {
		return nil, dbError("list paused types", err)
	}
	if out == nil {
		out = []PausedType{}
	}
	return out, nil
}

// PauseType stops every gateway's dispatcher from claiming rows of the effect type: they wait, uncharged
// (no attempt counted, no breaker touched), until ResumeType. Deliveries in flight finish. Pausing a paused
// type is a wrong state.
func (s *Service) PauseType(ctx context.Context, a Actor, typ, reason string) error {
	return s.typeAction(ctx, a, "type.pause", typ, reason, func(tx pgx.Tx) (bool, error) {
		return dedup.NewStore(tx).PauseType(ctx, typ, a.Name, reason)
	}, "is paused already")
}

// ResumeType lets the dispatchers claim the type's rows again and wakes them.
func (s *Service) ResumeType(ctx context.Context, a Actor, typ, reason string) error {
	return s.typeAction(ctx, a, "type.resume", typ, reason, func(tx pgx.Tx) (bool, error) {
		return dedup.NewStore(tx).ResumeType(ctx, typ)
	}, "is not paused")
}

func (s *Service) typeAction(ctx context.Context, a Actor, action, typ, reason string,
	do func(pgx.Tx) (bool, error), refusal string) error {
	if typ == "" {
		return &InvalidError{Field: "TYPE", Reason: "name an effect type"}
	}
	if err := checkText("TYPE", typ); err != nil {
		return err
	}
	if err := s.prepareChange(ctx, a, action, typ, reason); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := s.knownType(ctx, tx, typ); err != nil {
			return err
		}
		ok, err := do(tx)
		if err != nil {
			return dbError(action, err)
		}
		if !ok {
			return &StateError{Msg: fmt.Sprintf("effect type %q %s", typ, refusal)}
		}
		_, err = s.audit(ctx, tx, a, Audit{Action: action, Target: typ, Count: 1, Reason: reason})
		return err
	})
}

// LiftedPause is the pause ResumeDestination lifted.
type LiftedPause struct {
	Type        string    `json:"type"`
	Destination string    `json:"destination"`
	Until       time.Time `json:"until"` // when it was to end
	Status      int       `json:"status"`
	PausedBy    string    `json:"paused_by"`
	// Due counts its rows that were waiting for a retry, due now.
	Due int64 `json:"due"`
}

// ResumeDestination lifts the pause a destination of an effect type asked every gateway for (a 429 or 503
// with Retry-After, up to an hour): its receiver is back sooner, and its rows are claimed now, by every
// gateway, the one that got the answer too, those waiting for a retry (the attempt that got the 429, others
// in a backoff) with them. dest is a URL of the destination, as a webhook's payload would
// name it, in any spelling of its server (safehttp.Destination). Resuming a destination that is not paused
// is a wrong state.
func (s *Service) ResumeDestination(ctx context.Context, a Actor, typ, dest, reason string) (*LiftedPause, error) {
	if typ == "" {
		return nil, &InvalidError{Field: "TYPE", Reason: "name an effect type"}
	}
	if err := checkTexts("TYPE", typ, "DESTINATION", dest); err != nil {
		return nil, err
	}
	u, err := url.Parse(dest)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &InvalidError{Field: "DESTINATION", Reason: fmt.Sprintf("%q: want the receiver's URL, "+
			"such as https://hooks.example.com (`oncegate destination ls` lists the paused ones)", dest)}
	}
	if p := u.Port(); p != "" {
		// safehttp.Destination reads a port it cannot parse as the scheme's: `:99999` named http://…:80, a
		// destination nobody typed (an outside test).
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return nil, &InvalidError{Field: "DESTINATION", Reason: fmt.Sprintf("%q: port %s: want 1 to 65535", dest, p)}
		}
	}
	name := safehttp.Destination(u)
	if err := s.prepareChange(ctx, a, "destination.resume", typ+" "+name, reason); err != nil {
		return nil, err
	}
	out := &LiftedPause{Type: typ, Destination: name}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := s.knownType(ctx, tx, typ); err != nil {
			return err
		}
		l, ok, err := dedup.NewStore(tx).ResumeDestination(ctx, typ, name)
		if err != nil {
			return dbError("destination.resume", err)
		}
		if !ok {
			return &StateError{Msg: fmt.Sprintf("destination %s of effect type %q is not paused", name, typ)}
		}
		out.Until, out.Status, out.PausedBy, out.Due = l.Until, l.Status, l.PausedBy, l.Due
		_, err = s.audit(ctx, tx, a, Audit{Action: "destination.resume", Target: typ + " " + name, Count: 1,
			Reason: reason})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DestinationRate is one destination's deliveries of one effect type over the last hour: what an operator
// asks when a receiver says it got nothing (Svix's endpoint page).
type DestinationRate struct {
	Type        string `json:"type"`
	Destination string `json:"destination"`
	Attempts    int64  `json:"attempts"`
	Delivered   int64  `json:"delivered"`
	Failed      int64  `json:"failed"`
	Retried     int64  `json:"retried"`
	// InDoubt counts attempts whose outcome is not known: in doubt, or interrupted (the gateway died).
	InDoubt int64 `json:"in_doubt"`
	// SuccessRate is Delivered / Attempts.
	SuccessRate float64 `json:"success_rate"`
	// P50MS and P99MS bound the calls' latencies: the upper bound of the latency bucket (dedup.LatencyBuckets)
	// that holds the percentile; nil when no call was timed, or when it is past the last bound.
	P50MS *float64 `json:"p50_ms"`
	P99MS *float64 `json:"p99_ms"`
	// LastAttempt is the minute of the last attempt; nil when there was none in the hour (a destination
	// listed for its rows waiting or its pause).
	LastAttempt *time.Time `json:"last_attempt"`
	// PerSecond is its attempts a second over the last whole minute.
	PerSecond float64 `json:"per_second"`
	// LimitPerSecond and LimitBurst are its fleet-wide limit (effect type's rate), as the last take of its
	// tokens applied it; nil when it has none.
	LimitPerSecond *float64 `json:"limit_per_second"`
	LimitBurst     *int     `json:"limit_burst"`
	// Waiting counts its rows not being delivered now: due, waiting for a retry, a token or a pause.
	Waiting int64 `json:"waiting"`
	// PausedUntil is set while it asked the fleet to wait (a 429 or 503 with Retry-After): until when, the
	// status it answered (0: a pause's probe got no answer, and it was paused again), and the gateway that got
	// the answer (of the longest pause, when several tenants are paused).
	PausedUntil  *time.Time `json:"paused_until"`
	PausedStatus *int       `json:"paused_status"`
	PausedBy     *string    `json:"paused_by"`
	// PausedTenants are the tenants whose rows the pause holds, sorted: a pause is the tenant's whose
	// delivery got the answer. "" is every tenant (a row that names none, or a gateway older than migration
	// 00028). Empty when it is not paused.
	PausedTenants []string `json:"paused_tenants"`
	// Probing is set when a tenant's pause has run out and its rows wait for one call, its probe, to find the
	// destination ready (a 429 again sets the next pause): ProbingTenants are those tenants ("": every
	// tenant), and ProbeBy the gateway whose probe is out, nil while none is (the next goes within a second,
	// or when an operator's pause of the type ends).
	Probing        bool     `json:"probing"`
	ProbingTenants []string `json:"probing_tenants"`
	ProbeBy        *string  `json:"probe_by"`
}

// PausedFor names the tenants a destination's pause holds (Destination.PausedTenants): "every tenant" for a
// pause of them all, else the tenants, comma-separated.
func PausedFor(tenants []string) string {
	if len(tenants) == 0 || slices.Contains(tenants, "") {
		return "every tenant"
	}
	return strings.Join(tenants, ", ")
}

// ProbeState says where a destination's pause that has run out stands (DestinationRate.Probing): its probe
// out on a gateway, or waiting to go; "" when no pause of it has run out.
func ProbeState(d DestinationRate) string {
	switch {
	case !d.Probing:
		return ""
	case d.ProbeBy != nil:
		return "ended for " + PausedFor(d.ProbingTenants) + ", its probe out on " + *d.ProbeBy
	default:
		return "ended for " + PausedFor(d.ProbingTenants) + ", its probe to go"
	}
}

// DestinationWindow is how far back DestinationRates looks.
const DestinationWindow = time.Hour

// DestinationRates lists every destination delivered to in the last hour, or with rows waiting, or paused, by
// effect type, with its success rate and latencies, from the per-minute rollup the gateways write beside
// their attempt logs, and its fleet-wide limit, current rate, rows waiting and pause.
func (s *Service) DestinationRates(ctx context.Context, a Actor) ([]DestinationRate, error) {
	if err := s.allow(ctx, a, "destination.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, destinationRatesSQL, DestinationWindow.Seconds())
	if err != nil {
		return nil, dbError("read the destinations' rates", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DestinationRate, error) {
		var d DestinationRate
		var buckets []int64
		err := r.Scan(&d.Type, &d.Destination, &d.Attempts, &d.Delivered, &d.Failed, &d.Retried, &d.InDoubt,
			&buckets, &d.LastAttempt, &d.PerSecond, &d.LimitPerSecond, &d.LimitBurst, &d.Waiting, &d.PausedUntil,
			&d.PausedStatus, &d.PausedBy, &d.PausedTenants, &d.ProbingTenants, &d.ProbeBy)
		d.Probing = len(d.ProbingTenants) > 0
		if d.Attempts > 0 {
			d.SuccessRate = float64(d.Delivered) / float64(d.Attempts)
		}
		d.P50MS, d.P99MS = bucketBound(buckets, 0.5), bucketBound(buckets, 0.99)
		return d, err
	})
	if err != nil {
		return nil, dbError("read the destinations' rates", err)
	}
	if out == nil {
		out = []DestinationRate{}
	}
	return out, nil
}

// bucketBound is the upper bound of the latency bucket holding quantile q of the counts; nil when there are
// none, or when it falls past the last bound.
func bucketBound(counts []int64, q float64) *float64 {
	var total int64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return nil
	}
	var seen int64
	for i, c := range counts {
		seen += c
		if float64(seen) >= q*float64(total) {
			if i >= len(dedup.LatencyBuckets) {
				return nil
			}
			b := dedup.LatencyBuckets[i]
			return &b
		}
	}
	return nil
}

// TenantRate is the fleet-wide request bucket of a tenant whose rate has scope fleet
// (docs/configuration.md, tenant rates): one bucket that every gateway sharing the database takes from.
type TenantRate struct {
	Tenant string `json:"tenant"`
	// PerSecond and Burst are the tenant's rate as the last take of its tokens applied it.
	PerSecond float64 `json:"per_second"`
	Burst     int     `json:"burst"`
	// Available is how many tokens the bucket holds now: 0 is a tenant at its limit (its requests past what
	// the gateways hold are refused with 429), Burst one that sent nothing lately.
	Available int `json:"available"`
	// Taken counts every token granted to a gateway; LastTake is when one last took some.
	Taken    int64     `json:"taken"`
	LastTake time.Time `json:"last_take"`
}

// TenantRates lists the fleet-wide request buckets of the tenants (issue 31). A tenant whose rate has scope
// gateway has none: each gateway holds its bucket in memory.
func (s *Service) TenantRates(ctx context.Context, a Actor) ([]TenantRate, error) {
	if err := s.allow(ctx, a, "tenant.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, tenantRatesSQL)
	if err != nil {
		return nil, dbError("read the tenants' rates", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TenantRate, error) {
		var t TenantRate
		err := r.Scan(&t.Tenant, &t.PerSecond, &t.Burst, &t.Available, &t.Taken, &t.LastTake)
		return t, err
	})
	if err != nil {
		return nil, dbError("read the tenants' rates", err)
	}
	if out == nil {
		out = []TenantRate{}
	}
	return out, nil
}
