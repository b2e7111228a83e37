package outbox

import (
	"context"
	_ "embed"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dedup"
)

// Fleet-wide limits and pauses per effect type and destination (issue 31).
//
// A Rate is held by every gateway that shares the database, not by each: the tokens are a row per type and
// destination in oncegate_rate_buckets, which the claim path takes from in one statement (take_tokens.sql)
// for all the destinations of a claim. There are no per-gateway shares, so a gateway that starts takes
// tokens at its first claim and one that dies holds none back: the rows it had leased come back after their
// lease and take tokens again when claimed (a rescue is a call like any other).
//
// A destination is known only from a row's payload (providers.Destination), which a claim reads after it has
// leased the rows; so the rows a claim holds beyond the tokens it got are handed back (dedup.Store.Defer),
// unattempted and uncharged, not a breaker failure, each due when a token of its destination will be: the
// first at the next token, the next one interval later, and so on, in the order they were claimed. To keep
// such hand-backs few, each outbox row names its destination (written with the effect), and a limited
// type's claim (dedup's claim_limited.sql) leaves out the destinations that are paused or have no token,
// and takes no more rows of each than the tokens its bucket holds: one destination's backlog never holds
// back the type's others, and a claim seldom takes rows it must hand back. The cost: a limited type's claim
// is two statements (the claim, then the take), and of gateways racing for the same token the losers hand
// their rows back (one write). Unlimited types take no extra statement. Rows that this gateway's breaker would
// refuse are held back before the take (breakerSet.refuses): a token is spent only on a call that can be made.
//
// A destination that answers 429 or 503 with Retry-After pauses itself for the whole fleet: the gateway that
// got the answer writes oncegate_destination_pauses (pause.sql), and every claim of the type reads that
// table (dedup's claim.sql returns the type's pauses with its rows; take_tokens.sql for a limited type), so
// each gateway hands back the rows of a paused destination until the pause ends and calls it no more. The
// pause is the destination's Retry-After, which safehttp.RetryAfter caps at an hour.

//go:embed sql/take_tokens.sql
var takeTokensSQL string

//go:embed sql/pause.sql
var pauseSQL string

//go:embed sql/pause_left.sql
var pauseLeftSQL string

// Rate is a fleet-wide limit on an effect type's calls to each of its destinations.
type Rate struct {
	// PerSecond is the sustained rate of calls to one destination, across every gateway. Required, > 0.
	PerSecond float64
	// Burst is how many calls may go at once after the destination was quiet. Defaults to DefaultBurst(PerSecond).
	Burst int
}

// DefaultBurst is a rate's burst when it names none: one second of calls, at least one.
func DefaultBurst(perSecond float64) int { return max(1, int(perSecond)) }

// interval is the time between two tokens.
func (r *Rate) interval() time.Duration { return time.Duration(float64(time.Second) / r.PerSecond) }

// failedTakeWait is how long the rows of a claim whose take of tokens failed wait: no token, no call.
const failedTakeWait = time.Second

// pauseKey names a pause: of destination dest of effect type typ, for tenant ("": for every tenant).
type pauseKey struct{ typ, tenant, dest string }

// pauses is what a dispatcher knows of the fleet's paused destinations: from its claims and its own
// attempts. It is checked once more right before each call, so a row claimed before a pause began waits too.
// A pause is the tenant's whose delivery got the 429 or 503 (migration 00028): another tenant's rows to the
// same destination go on, as one tenant's breaker holds no other back; a pause of every tenant ("") is one a
// row that names no tenant got, or a gateway older than 00028 wrote. A row waits for its tenant's pause and
// for every tenant's, the longer.
// A pause the fleet's table holds may be lifted there by an operator (`oncegate destination resume`): such a
// pause is asked of the table again, at most every pauseRecheck, when a row of its destination comes up,
// and the gateway that got the 429 calls the destination again too. Rows of a paused destination seldom come
// up: the claims leave them out. A pause the table does not hold (writing it failed) is this gateway's alone,
// kept until it ends.
type pauses struct {
	mu sync.Mutex
	at map[pauseKey]*pause
}

type pause struct {
	until   time.Time
	kept    bool      // oncegate_destination_pauses holds it
	checked time.Time // when the table was last asked
}

// pauseRecheck is how often a pause the fleet's table holds is asked of it again while rows of its
// destination come up: how soon an operator's lift reaches a gateway that holds the pause itself.
const pauseRecheck = time.Second

// note keeps a pause of dest of typ for tenant until until; kept says that the fleet's table holds it (and
// since when it was last read from there: now).
func (p *pauses) note(typ, tenant, dest string, until time.Time, kept bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at == nil {
		p.at = map[pauseKey]*pause{}
	}
	k := pauseKey{typ, tenant, dest}
	e := p.at[k]
	if e == nil {
		e = &pause{}
		p.at[k] = e
	}
	if until.After(e.until) {
		e.until = until
	}
	if kept {
		e.kept, e.checked = true, time.Now()
	}
}

// set makes what holds tenant's rows to dest of typ what the fleet's table says (pause_left.sql: the
// tenant's pause or every tenant's, the longer): ms left, or none when ms is nil, which lifts both.
func (p *pauses) set(typ, tenant, dest string, ms *int64, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ms == nil {
		delete(p.at, pauseKey{typ, tenant, dest})
		delete(p.at, pauseKey{typ, "", dest})
		return
	}
	if p.at == nil {
		p.at = map[pauseKey]*pause{}
	}
	p.at[pauseKey{typ, tenant, dest}] = &pause{until: now.Add(time.Duration(*ms) * time.Millisecond), kept: true,
		checked: now}
}

// lift forgets the pause of dest of typ for tenant: its probe's answer lifted it (probe.go).
func (p *pauses) lift(typ, tenant, dest string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.at, pauseKey{typ, tenant, dest})
}

// stale has the fleet's table asked again about every pause of typ it holds, at the next row of each that
// comes up: a notification of typ may be an operator's lift (`oncegate destination resume`), which this
// gateway would otherwise hold on to for up to pauseRecheck, and, its rows handed back, until the next poll.
func (p *pauses) stale(typ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, e := range p.at {
		if k.typ == typ && e.kept {
			e.checked = time.Time{}
		}
	}
}

// left returns how long tenant's rows to dest of typ are still paused (by the tenant's pause or every
// tenant's), zero when they are not, and whether the fleet's table is to be asked again (the caller that gets
// true asks; the others go by what is known meanwhile).
func (p *pauses) left(typ, tenant, dest string, now time.Time, force bool) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var left time.Duration
	ask := false
	keys := []pauseKey{{typ, "", dest}, {typ, tenant, dest}}
	if tenant == "" {
		keys = keys[:1]
	}
	for _, k := range keys {
		e, ok := p.at[k]
		if !ok {
			continue
		}
		if !e.until.After(now) {
			delete(p.at, k)
			continue
		}
		if e.kept && (force || now.Sub(e.checked) >= pauseRecheck) {
			e.checked = now
			ask = true
		}
		left = max(left, e.until.Sub(now))
	}
	return left, ask
}

// pauseTenant is the tenant whose pauses hold r, and whose pause an answer to r records: "" (every tenant)
// for a row whose outbox row names no tenant (dedup.Claimed.Untenanted), as the claims read it, though its
// effect has one. Keyed by the effect's tenant, such a row's 429 paused nothing the claims saw, and every
// gateway kept calling (tests.TestFleetHoldsADestinationsRateAndItsRetryAfter).
func pauseTenant(r dedup.Claimed) string {
	if r.Untenanted {
		return ""
	}
	return r.Tenant
}

// pausedFor returns how long tenant's rows to dest of t are still paused, zero when they are not: as this
// gateway knows it, asked of the fleet's table again when that is due (pauses), or at once with force when
// the table holds the pause. Should the table not answer, what is known holds.
func (d *Dispatcher) pausedFor(t *effectType, tenant, dest string, now time.Time, force bool) time.Duration {
	left, ask := d.pauses.left(t.Name, tenant, dest, now, force)
	if !ask {
		return left
	}
	ctx, cancel := d.dbContext()
	defer cancel()
	var ms *int64
	if err := d.pool.QueryRow(ctx, pauseLeftSQL, t.Name, dest, tenant).Scan(&ms); err != nil {
		d.log.Warn("asking whether a paused destination is paused still failed; it stays paused here",
			"type", t.Name, "destination", dest, "tenant", tenant, "err", err)
		return left
	}
	d.pauses.set(t.Name, tenant, dest, ms, now)
	if ms == nil {
		d.log.Info("a destination's pause was lifted: it is called again", "type", t.Name, "destination", dest,
			"tenant", tenant)
		return 0
	}
	return time.Duration(*ms) * time.Millisecond
}

// rateState is what the claim loop remembers of a type's last hold-back.
type rateState struct {
	// wake is when a token of a destination that ran short is due, or a pause ends: the claim leaves those
	// destinations out until then, and nothing else would wake the type before the poll.
	wake time.Time
	// empty counts a limited type's claims in a row that found nothing (emptyClaim).
	empty int
}

// claimed notes what a limited type's claim found. A claim of a limited type that finds nothing has most
// likely met destinations with no token: another gateway took it, and this one took none, so no take of
// its own said when the next is due. Left to the poll (1 s by default), a fleet of three gateways delivered
// 28 a second of a 50 a second limit, in bursts and gaps of up to 676 ms, and one gateway alone 27. So the
// claim is tried again a token's interval later, then twice that, and so on up to the poll, from which
// notifications and the poll take over again: a backlog that truly ran out costs a few empty claims.
func (s *rateState) claimed(rows int, now time.Time, interval, poll time.Duration) {
	if rows > 0 {
		s.empty = 0
		return
	}
	s.empty++
	wait := interval << min(s.empty-1, 20)
	if wait < poll {
		s.wakeAt(now.Add(wait + rand.N(interval/4+1)))
	}
}

// wakeAt moves the type's next wake to at, when that is sooner.
func (s *rateState) wakeAt(at time.Time) {
	if s.wake.IsZero() || at.Before(s.wake) {
		s.wake = at
	}
}

// holdBack keeps the claimed rows that may be attempted now and hands the others back, uncharged: those of
// a paused destination until its pause ends, and, for a limited type, those beyond the tokens their
// destination had, each until its token is due. It returns the rows kept and how many went back.
func (d *Dispatcher) holdBack(ctx context.Context, t *effectType, rs *rateState, rows []dedup.Claimed) ([]dedup.Claimed, int) {
	if len(rows) == 0 {
		return rows, 0
	}
	now := time.Now()
	for _, p := range rows[0].DestinationPauses {
		d.pauses.note(t.Name, p.Tenant, p.Destination, now.Add(p.Left), true)
	}
	dests := make([]string, len(rows))
	for i := range rows {
		dests[i] = destination(t, &rows[i]) // kept in the row for its delivery
	}
	var keep, back []dedup.Claimed
	var delays []time.Duration
	var backDests []string
	var inPlace []bool
	at := make(map[int64]string, len(rows))
	for i, r := range rows {
		at[r.EffectID] = dests[i]
	}
	// hand hands r back for wait. A row whose destination has no token or is paused keeps its place: the
	// claims leave it out until then themselves (defer.sql).
	hand := func(r dedup.Claimed, wait time.Duration, place bool) {
		back = append(back, r)
		delays = append(delays, wait)
		backDests = append(backDests, at[r.EffectID])
		inPlace = append(inPlace, place)
	}
	// The rows that may go, for a limited type, once they have their tokens.
	var open []dedup.Claimed
	var openDests []string
	probing := map[breakerKey]bool{}
	for i, r := range rows {
		left := d.pausedFor(t, pauseTenant(r), dests[i], now, false)
		switch {
		case r.Rescued && (t.Rate == nil || left > 0 || decide(event{stage: stageClaimed}, r, t.policy).kind != actDeliver):
			// A rescued row goes on to its delivery, which logs the interrupted attempt and decides on it (an
			// at_most_once effect, or one whose attempts are used up, is unknown, uncalled), and whose call a
			// pause refuses, uncharged. Claimed whatever its destination's pause or tokens (claim.sql,
			// claim_limited.sql), it takes a token only to be called.
			keep = append(keep, r)
		case r.Rescued:
			open, openDests = append(open, r), append(openDests, dests[i])
		case left > 0:
			// Paused for the row's tenant (a limited type's take asks only every tenant's pauses): the claims
			// leave such rows out, so this one was claimed as the pause began, or names no destination.
			hand(r, left+rand.N(minRefusedWait), true)
			rs.wakeAt(now.Add(left + minRefusedWait))
		case t.Rate == nil:
			keep = append(keep, r)
		default:
			// A row that this gateway's breaker would refuse waits for it here, uncharged, and takes no token:
			// taken first, the tokens went on calls never made, and the rest of the fleet had fewer of them.
			if wait, refused := d.breakers.refuses(t, r.Tenant, dests[i], now, probing); refused {
				hand(r, wait, false)
				continue
			}
			open, openDests = append(open, r), append(openDests, dests[i])
		}
	}
	if len(open) > 0 {
		keep = append(keep, d.takeFor(ctx, t, rs, now, open, openDests, hand)...)
	}
	if len(back) > 0 {
		d.deferRows(t, back, delays, backDests, inPlace)
	}
	return keep, len(back)
}

// takeFor takes the tokens of a limited type's rows (dests their destinations) and returns those that got
// one; hand hands back the others, each until its token is due, or its destination's pause ends.
func (d *Dispatcher) takeFor(ctx context.Context, t *effectType, rs *rateState, now time.Time, rows []dedup.Claimed,
	dests []string, hand func(r dedup.Claimed, wait time.Duration, place bool)) []dedup.Claimed {
	need := map[string]int{}
	for _, dest := range dests {
		need[dest] = min(need[dest]+1, t.Rate.Burst)
	}
	got, err := d.takeTokens(ctx, t, "", slices.Sorted(maps.Keys(need)), need)
	if err != nil {
		d.log.Warn("taking delivery tokens failed; the claim's rows go back uncharged", "type", t.Name,
			"err", err, "in", failedTakeWait.String())
		for _, r := range rows {
			hand(r, failedTakeWait, false)
		}
		rs.wakeAt(now.Add(failedTakeWait))
		return nil
	}
	var keep []dedup.Claimed
	used := map[string]int{}
	for i, r := range rows {
		g := got[dests[i]]
		if g.paused {
			d.pauses.note(t.Name, "", dests[i], now.Add(g.next), true)
			hand(r, g.next+rand.N(minRefusedWait), true)
			continue
		}
		k := used[dests[i]]
		used[dests[i]]++
		if k < g.granted {
			keep = append(keep, r)
			continue
		}
		hand(r, g.next+time.Duration(k-g.granted)*t.Rate.interval(), true)
	}
	// A jitter of up to a quarter interval keeps the gateways of a fleet from all asking for the same token at
	// the same instant; more would leave tokens of a small burst unused.
	for _, g := range got {
		switch {
		case g.paused:
			rs.wakeAt(now.Add(g.next + minRefusedWait))
		case g.left < 1:
			rs.wakeAt(now.Add(g.next + rand.N(t.Rate.interval()/4+1)))
		}
	}
	return keep
}

// grant is one destination's answer to a take of tokens.
type grant struct {
	granted int
	next    time.Duration // until its next token is due, or its pause ends
	left    float64       // tokens it has left now
	paused  bool
}

// takeTokens takes, for each destination of names, up to need of it of t's tokens, in one statement.
func (d *Dispatcher) takeTokens(ctx context.Context, t *effectType, tenant string, names []string, need map[string]int) (map[string]grant, error) {
	ns := make([]int32, len(names))
	for i, n := range names {
		ns[i] = int32(need[n])
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ClaimTimeout)
	defer cancel()
	rows, err := d.pool.Query(cctx, takeTokensSQL, t.Name, names, ns, t.Rate.PerSecond, t.Rate.Burst, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]grant, len(names))
	for rows.Next() {
		var dest string
		var g grant
		var nextMS int64
		if err := rows.Scan(&dest, &g.granted, &nextMS, &g.left, &g.paused); err != nil {
			return nil, err
		}
		g.next = time.Duration(nextMS) * time.Millisecond
		out[dest] = g
	}
	return out, rows.Err()
}

// deferRows hands rows back through dedup.Store.Defer. A failed write leaves them leased: they come back
// when their leases run out, attempted then, so the failure costs time, never an effect.
func (d *Dispatcher) deferRows(t *effectType, rows []dedup.Claimed, delays []time.Duration, dests []string, keep []bool) {
	ctx, cancel := d.dbContext()
	defer cancel()
	if err := d.store.Defer(ctx, rows, delays, dests, keep); err != nil {
		d.log.Error("handing back rows held by a delivery limit or a paused destination failed; they come back "+
			"after their leases", "type", t.Name, "rows", len(rows), "err", err)
	}
}

// pauseDestination pauses dest of t for tenant's rows ("": every tenant's), for every gateway, for wait, as
// the destination asked with status in its answer to the delivery that log is about: probe pr's call when pr
// is not nil, whose answer sets the next pause whatever the last one was (probe.go).
func (d *Dispatcher) pauseDestination(log *slog.Logger, t *effectType, tenant, dest string, wait time.Duration,
	status int, pr *dedup.Probe) {
	d.pauses.note(t.Name, tenant, dest, time.Now().Add(wait), false)
	d.wakeAfter(t, wait)
	time.AfterFunc(wait, d.signalProbe)
	ctx, cancel := d.dbContext()
	defer cancel()
	if _, err := d.pool.Exec(ctx, pauseSQL, t.Name, dest, wait.Milliseconds(), status, d.cfg.Owner, tenant,
		probeArg(pr)); err != nil {
		log.Error("recording a destination's pause failed; only this gateway holds it", "destination", dest,
			"err", err)
		return
	}
	d.pauses.note(t.Name, tenant, dest, time.Now().Add(wait), true)
	log.Warn("the destination asked to wait: this tenant's deliveries to it are paused for every gateway",
		"destination", dest, "status", status, "for", wait.String())
}
