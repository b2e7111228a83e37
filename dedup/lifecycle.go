package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/notifier"
)

// Lease names a claimed outbox row and the token that fences every write to it: only the current holder's
// Finish or Reschedule changes anything. The token goes to the database as a pgtype.UUID (uuidArg): pgx's
// exec and simple protocol modes, which a transaction-pooling PgBouncer needs, cannot encode a bare [16]byte.
type Lease struct {
	EffectID int64
	Token    [16]byte
}

// Claimed is an outbox row leased to a dispatcher, with what delivering its effect needs.
type Claimed struct {
	Lease
	// Rescued is set when the row's previous lease expired: its dispatcher died mid-delivery, and that
	// attempt may have reached the provider.
	Rescued bool
	// Untenanted is set when the outbox row names no tenant (written by a gateway older than migration 00016):
	// the claim could not leave it out for its tenant's share in flight (ClaimParams.SkipTenants).
	Untenanted bool
	Tenant     string
	Key        string
	Type       string
	Payload    json.RawMessage
	Attempts   int // failed attempts so far
	CreatedAt  time.Time
	Trace      map[string]string // the creating request's W3C trace context
	// StableID names the effect to its receiver, the same on every attempt (effect.NewStableID).
	StableID string
	// InterruptedAttempts counts the attempts interrupted since the effect's last recorded outcome, this
	// rescue's included (migration 00027): a gateway that rescued the row may have died in turn before it
	// recorded anything. The next outcome recorded adds them to the effect's attempts (Finish.Interrupted).
	InterruptedAttempts int
	// Interrupted is, for a rescued row, the lease it was rescued from: which gateway held it, under which
	// token, until when. Zero when that is not known (a row handed back after its rescue).
	Interrupted InterruptedLease
	// LeasedAt is when the statement that leased the row was sent, by this process's clock: never after the
	// database began the lease, so LeasedAt plus the lease's length never overstates how long it runs. The
	// dispatcher keeps trying to record an outcome, and extends the lease, against that bound.
	LeasedAt time.Time
	// DestinationPauses are the pauses of the row's type's destinations that the whole fleet keeps (a 429 or
	// 503 with Retry-After), for the tenants of the claim's rows and for every tenant, with the time left by
	// the database's clock when the row was claimed. One slice, shared by every row of a claim: the claim
	// reads it once, and for an unlimited type only when a row it claims names no destination or is rescued
	// (the rows that name one are left out while their destination is paused for their tenant).
	DestinationPauses []DestinationPause
	// PauseAsked is the destination whose pause for the fleet the statement that leased the row asked about
	// ("": none was asked; CreateLeased asks for a new effect that names one), and PauseLeft what was left
	// then of a pause of it (0: none): the request that performs the row at once need not ask again.
	PauseAsked string
	PauseLeft  time.Duration
	// Destination is providers.Destination of Payload once the dispatcher has worked it out ("": not yet).
	// A delivery asks for it at the claim's hold-back, the call and the attempt log, and a webhook's takes a
	// decode of its payload each time: decoding it once cut a gateway's CPU a webhook (issue 32).
	Destination string
}

// InterruptedLease is a lease that ran out before its holder recorded an outcome.
type InterruptedLease struct {
	Owner   string
	Token   *[16]byte
	Expired time.Time
}

// interruptedLease is the lease a claim rescued a row from, as its statement returned it (NULLs when the row
// was not leased; an expiry of '-infinity' for a row handed back after its rescue, whose holder is not known).
func interruptedLease(owner *string, token pgtype.UUID, expires pgtype.Timestamptz) InterruptedLease {
	var l InterruptedLease
	if owner != nil {
		l.Owner = *owner
	}
	if token.Valid {
		tok := token.Bytes
		l.Token = &tok
	}
	if expires.Valid && expires.InfinityModifier == pgtype.Finite {
		l.Expired = expires.Time
	}
	return l
}

// ClaimParams says which rows to claim, for whom, and for how long.
type ClaimParams struct {
	Type  string
	Limit int
	Owner string
	Lease time.Duration
	// SkipTenants are tenants whose rows this claim leaves for later.
	SkipTenants []string
	// Burst, when not 0, is the burst of the type's fleet-wide delivery limit: the claim goes by destination
	// (claim_limited.sql), leaving out those without a token and taking no more of each than its tokens.
	Burst int
}

// Claim leases up to p.Limit due outbox rows of p.Type (new, due for a retry, or rescued from an expired
// lease), which makes their effects delivering (status.sql), and reads their payloads. Claims in any number
// of gateways never wait on each other.
//
// The leases commit first and the payloads are read after, by a statement that locks nothing, so that a row
// Postgres cannot read back fails only the read and holds no lock while Postgres takes its time to fail.
// When the read fails, Claim hands the rows back, unattempted, and returns the error: ClaimLeases and Payload
// then find the row at fault one row at a time.
func (s *Store) Claim(ctx context.Context, p ClaimParams) ([]Claimed, error) {
	rows, err := s.claimLeases(ctx, p)
	if err != nil || len(rows) == 0 {
		return rows, err
	}
	if err := s.readOrHandBack(ctx, rows, p.Lease, func(ctx context.Context) error {
		return s.readPayloads(ctx, rows)
	}); err != nil {
		return nil, err
	}
	// A row whose lease was lost in between (an operator's retry) is another dispatcher's now.
	kept := rows[:0]
	for _, r := range rows {
		if r.Payload != nil {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// DestinationPause is a destination's pause that a claim read: the tenant whose rows it holds ("": every
// tenant's, migration 00028), and the time left.
type DestinationPause struct {
	Tenant, Destination string
	Left                time.Duration
}

// destinationPauses reads a claim's [tenant, destination, ms left] triples.
func destinationPauses(triples [][]any) []DestinationPause {
	out := make([]DestinationPause, 0, len(triples))
	for _, v := range triples {
		if len(v) != 3 {
			continue
		}
		tenant, _ := v[0].(string)
		dest, _ := v[1].(string)
		ms, _ := v[2].(float64)
		out = append(out, DestinationPause{Tenant: tenant, Destination: dest, Left: time.Duration(ms) * time.Millisecond})
	}
	return out
}

// readOrHandBack runs read, the read that follows a claim of rows, within readBound; when it fails, the rows
// go back, unattempted, or their leases would run out and the rows be rescued as a crash's.
func (s *Store) readOrHandBack(ctx context.Context, rows []Claimed, lease time.Duration,
	read func(context.Context) error) error {
	rctx, cancel := readBound(ctx, rows, lease)
	err := read(rctx)
	cancel()
	if err == nil {
		return nil
	}
	// The read may have failed by running out of ctx: the hand-back gets a bound of its own.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if herr := s.handBack(hctx, rows); herr != nil {
		return fmt.Errorf("%w; and handing the rows back: %w", err, herr)
	}
	return err
}

// readBound bounds the read that follows a claim by half the lease its rows were leased for: a read that took
// longer (a partition of the effects locked, a stalled database) would let the leases run out before the rows
// are handed back, and another gateway rescue them as a crash's, though no provider was called. A caller's
// claim timeout may be longer than a short type's lease. Never less than minReadBound: a lease is a provider's
// timeout and a margin of seconds, and one shorter (a test's) must not fail reads that a busy Postgres takes
// tens of milliseconds to answer.
func readBound(ctx context.Context, rows []Claimed, lease time.Duration) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, rows[0].LeasedAt.Add(max(lease/2, minReadBound)))
}

const minReadBound = time.Second

// releaseTimeout bounds handing back the rows of a claim whose payloads could not be read.
const releaseTimeout = 10 * time.Second

// ClaimLeases is Claim without the payloads: every Claimed has a nil Payload, for Payload to read.
func (s *Store) ClaimLeases(ctx context.Context, p ClaimParams) ([]Claimed, error) {
	rows, err := s.claimLeases(ctx, p)
	if err != nil || len(rows) == 0 {
		return rows, err
	}
	ids := make([]int64, len(rows))
	at := make(map[int64]int, len(rows))
	for i, r := range rows {
		ids[i], at[r.EffectID] = r.EffectID, i
	}
	found := make([]bool, len(rows))
	if err := s.readOrHandBack(ctx, rows, p.Lease, func(ctx context.Context) error {
		return s.readLeasedEffects(ctx, ids, func(id int64, e leasedEffect) {
			if i, ok := at[id]; ok {
				e.fill(&rows[i])
				found[i] = true
			}
		})
	}); err != nil {
		return nil, err
	}
	// An effect purged since its row was leased: the lease runs out unused, as the claim's join left it.
	kept := rows[:0]
	for i, r := range rows {
		if found[i] {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

func (s *Store) readLeasedEffects(ctx context.Context, ids []int64, each func(int64, leasedEffect)) error {
	rs, err := s.db.Query(ctx, leasedEffectsSQL, ids)
	if err != nil {
		return translate("read leased effects", err)
	}
	defer rs.Close()
	for rs.Next() {
		var id int64
		var e leasedEffect
		if err := rs.Scan(&id, &e.tenant, &e.key, &e.typ, &e.attempts, &e.createdAt, &e.stableID); err != nil {
			return translate("read leased effects", err)
		}
		each(id, e)
	}
	return translate("read leased effects", rs.Err())
}

// leasedEffect is what delivering a leased row needs of its effect, read apart from the claim (claim.sql
// says why): with the payloads (read_payloads.sql) or without (leased_effects.sql).
type leasedEffect struct {
	tenant, key, typ string
	attempts         int
	createdAt        time.Time
	stableID         *string
}

func (e leasedEffect) fill(c *Claimed) {
	c.Tenant, c.Key, c.Type, c.Attempts, c.CreatedAt = e.tenant, e.key, e.typ, e.attempts, e.createdAt
	c.StableID = stableIDOf(e.tenant, e.key, e.stableID)
}

// claimLeases leases the rows: the Claimed it returns know their outbox row (lease, tenant, type, trace), not
// yet their effect (key, attempts, stable id).
func (s *Store) claimLeases(ctx context.Context, p ClaimParams) ([]Claimed, error) {
	sent := time.Now()
	var rs pgx.Rows
	var err error
	if p.Burst > 0 {
		rs, err = pinned(ctx, s.db, claimLimitedSQL, p.Type, p.Limit, p.Owner, p.Lease.Milliseconds(),
			append([]string{}, p.SkipTenants...), p.Burst)
	} else {
		rs, err = pinned(ctx, s.db, claimSQL, p.Type, p.Limit, p.Owner, p.Lease.Milliseconds(),
			append([]string{}, p.SkipTenants...))
	}
	if err != nil {
		return nil, translate("claim "+p.Type, err)
	}
	var pauses []DestinationPause
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		var tenant, prevOwner *string
		var prevToken pgtype.UUID
		var prevExpires pgtype.Timestamptz
		var paused [][]any
		err := r.Scan(&c.EffectID, &c.Token, &c.Rescued, &tenant, &c.Type, &c.Trace, &prevOwner, &prevToken,
			&prevExpires, &c.InterruptedAttempts, &paused)
		if tenant != nil {
			c.Tenant = *tenant
		} else {
			c.Untenanted = true
		}
		if len(paused) > 0 {
			if pauses == nil {
				pauses = destinationPauses(paused)
			}
			c.DestinationPauses = pauses
		}
		c.LeasedAt = sent
		c.Interrupted = interruptedLease(prevOwner, prevToken, prevExpires)
		return c, err
	})
	if err != nil {
		return nil, translate("claim "+p.Type, err)
	}
	return out, nil
}

// ClaimNew leases the outbox row of effect id, of type p.Type, which this gateway has just created: Claim for
// one row named by its ID, due and never leased (claim_new.sql), without the read that follows a claim. The
// Claimed knows its lease, tenant, type and trace; the caller, which created the effect, fills in the rest
// (key, payload, stable id, created_at; no attempt yet). When the row is not taken, ok is false and paused
// tells why: set, the row waits for its type's or destination's pause; not set, another claim has it (or it
// is not due, or gone). p.Limit and p.SkipTenants are not read.
func (s *Store) ClaimNew(ctx context.Context, id int64, p ClaimParams) (c Claimed, ok, paused bool, err error) {
	sent := time.Now()
	var eid *int64
	var token pgtype.UUID
	var tenant, typ *string
	var interrupted *int
	err = s.db.QueryRow(ctx, claimNewSQL, id, p.Type, p.Owner, p.Lease.Milliseconds()).
		Scan(&eid, &token, &tenant, &typ, &c.Trace, &interrupted, &paused)
	if err != nil {
		return Claimed{}, false, false, translate("claim new "+p.Type, err)
	}
	if eid == nil {
		return Claimed{}, false, paused, nil
	}
	c.EffectID, c.Token, c.Type, c.LeasedAt = *eid, token.Bytes, *typ, sent
	if tenant != nil {
		c.Tenant = *tenant
	}
	if interrupted != nil {
		c.InterruptedAttempts = *interrupted
	}
	return c, true, false, nil
}

// Probe names the probe of a destination's pause (migration 00030): the pause of Destination of effect type
// Type for Tenant ("": every tenant's), and the probe's token.
type Probe struct {
	Type, Destination, Tenant string
	Token                     [16]byte
}

// ClaimProbe takes the probe of pr's pause, whose end has passed, for p.Owner (claim_probe.sql, pinned as the
// claims are: a plan made on an empty outbox walked it whole): it leases the pause's oldest waiting row for
// p.Lease, reads its payload as Claim does, and notes in the pause that the probe is out. ok is false when no
// row was taken: another gateway has the probe, or the pause is gone, or no row waits for it, in which case
// the pause is lifted (lifted). p.Limit, p.SkipTenants and p.Burst are not read.
func (s *Store) ClaimProbe(ctx context.Context, pr Probe, p ClaimParams) (c Claimed, ok, lifted bool, err error) {
	sent := time.Now()
	var eid *int64
	var token pgtype.UUID
	var tenant, typ *string
	var interrupted *int
	rs, err := pinned(ctx, s.db, claimProbeSQL, pr.Type, pr.Destination, pr.Tenant, p.Owner, p.Lease.Milliseconds(),
		uuidArg(pr.Token))
	if err == nil {
		_, err = pgx.CollectExactlyOneRow(rs, func(r pgx.CollectableRow) (struct{}, error) {
			return struct{}{}, r.Scan(&eid, &token, &tenant, &typ, &c.Trace, &interrupted, &lifted)
		})
	}
	if err != nil {
		return Claimed{}, false, false, translate("claim the probe of a pause of "+pr.Type, err)
	}
	if eid == nil {
		return Claimed{}, false, lifted, nil
	}
	c.EffectID, c.Token, c.Type, c.LeasedAt, c.Destination = *eid, token.Bytes, *typ, sent, pr.Destination
	if tenant != nil {
		c.Tenant = *tenant
	} else {
		c.Untenanted = true
	}
	if interrupted != nil {
		c.InterruptedAttempts = *interrupted
	}
	rows := []Claimed{c}
	if err := s.readOrHandBack(ctx, rows, p.Lease, func(ctx context.Context) error {
		return s.readPayloads(ctx, rows)
	}); err != nil {
		return Claimed{}, false, false, err
	}
	if rows[0].Payload == nil { // an operator's retry took the row meanwhile
		return Claimed{}, false, false, nil
	}
	return rows[0], true, false, nil
}

// ProbeEnd is what became of a probe's call (EndProbe).
type ProbeEnd string

const (
	// ProbeLift: the destination answered without asking to wait: the pause is lifted for every gateway.
	ProbeLift ProbeEnd = "lift"
	// ProbeAgain: the call got no answer to go by (a timeout, a refused connection, a 5xx without
	// Retry-After): the destination is paused again as long as the last pause was.
	ProbeAgain ProbeEnd = "again"
	// ProbeFree: no call was made: the probe is freed for the next.
	ProbeFree ProbeEnd = "free"
)

// EndProbe ends probe pr as end says (probe_end.sql). It reports whether the pause was lifted, and how long it
// now lasts when it was paused again; neither when pr is no longer the pause's probe.
func (s *Store) EndProbe(ctx context.Context, pr Probe, end ProbeEnd) (lifted bool, again time.Duration, err error) {
	var ms *int64
	var notified int64
	err = s.db.QueryRow(ctx, probeEndSQL, pr.Type, pr.Destination, pr.Tenant, uuidArg(pr.Token), string(end),
		string(notifier.TopicOutbox)).Scan(&lifted, &ms, &notified)
	if err != nil {
		return false, 0, translate("end the probe of a pause of "+pr.Type, err)
	}
	if ms != nil {
		again = time.Duration(*ms) * time.Millisecond
	}
	return lifted, again, nil
}

// Payload reads the payload of a row leased by ClaimLeases. It returns ErrLeaseLost when the lease is no
// longer the row's, ErrUnavailable when the database is (or ctx ran out first), and otherwise an error that
// belongs to this row. A payload that Postgres cannot print (a legacy jsonb payload that prints to over
// 1 GB) may take it many seconds to fail, and neither a cancel nor statement_timeout stops it sooner; ctx
// bounds the wait, and the read locks nothing meanwhile.
func (s *Store) Payload(ctx context.Context, lease Lease) (json.RawMessage, error) {
	row := []Claimed{{Lease: lease}}
	if err := s.readPayloads(ctx, row); err != nil {
		return nil, err
	}
	if row[0].Payload == nil {
		return nil, ErrLeaseLost
	}
	return row[0].Payload, nil
}

// readPayloads fills in the payloads of leased rows, and what they need of their effects; a row whose lease
// was lost keeps a nil Payload.
func (s *Store) readPayloads(ctx context.Context, rows []Claimed) error {
	ids, tokens := make([]int64, len(rows)), make([]pgtype.UUID, len(rows))
	at := make(map[int64]int, len(rows))
	for i, r := range rows {
		ids[i], tokens[i] = r.EffectID, uuidArg(r.Token)
		at[r.EffectID] = i
	}
	rs, err := s.db.Query(ctx, readPayloadsSQL, ids, tokens)
	if err != nil {
		return translate("read payloads", err)
	}
	defer rs.Close()
	for rs.Next() {
		var id int64
		var p json.RawMessage
		var e leasedEffect
		if err := rs.Scan(&id, &p, &e.tenant, &e.key, &e.typ, &e.attempts, &e.createdAt, &e.stableID); err != nil {
			return translate("read payloads", err)
		}
		if i, ok := at[id]; ok {
			rows[i].Payload = p
			e.fill(&rows[i])
		}
	}
	return translate("read payloads", rs.Err())
}

// handBack hands rows leased by claimLeases back, unattempted and due at once, writing no effect
// (hand_back.sql).
func (s *Store) handBack(ctx context.Context, rows []Claimed) error {
	a := leaseArgsOf(rows)
	return translate("hand back claimed rows", pinnedExec(ctx, s.db, handBackSQL, a.ids, a.tokens, a.rescued,
		a.interruptedOwners))
}

// leaseArgs are the arrays the statements that hand leased rows back take (hand_back.sql, release.sql,
// defer.sql), paired by index: the rows' effect ids, lease tokens, whether each was rescued, and the holder
// each was rescued from (NULL when not rescued, or not known), which a rescued row keeps for the claim that
// takes it next to log its interrupted attempt under.
type leaseArgs struct {
	ids               []int64
	tokens            []pgtype.UUID
	rescued           []bool
	interruptedOwners []*string
}

func leaseArgsOf(rows []Claimed) leaseArgs {
	a := leaseArgs{ids: make([]int64, len(rows)), tokens: make([]pgtype.UUID, len(rows)),
		rescued: make([]bool, len(rows)), interruptedOwners: make([]*string, len(rows))}
	for i, r := range rows {
		a.ids[i], a.tokens[i], a.rescued[i] = r.EffectID, uuidArg(r.Token), r.Rescued
		if r.Rescued && r.Interrupted.Owner != "" {
			a.interruptedOwners[i] = &r.Interrupted.Owner
		}
	}
	return a
}

// release hands rows leased by the dedup proxy back, unattempted and due at once (release.sql).
func (s *Store) release(ctx context.Context, rows []Claimed) error {
	a := leaseArgsOf(rows)
	err := pinnedExec(ctx, s.db, releaseSQL, a.ids, a.tokens, a.rescued, effect.StatusPending, a.interruptedOwners)
	return translate("hand back claimed rows", err)
}

// Finish is a terminal outcome.
type Finish struct {
	// Status must be terminal.
	Status effect.Status
	// Result replaces the stored result; nil keeps it.
	Result json.RawMessage
	// LastError replaces the stored error; empty clears it.
	LastError string
	// Attempted counts an attempt: false when no provider was called (a breaker's refusal, an unreadable
	// payload).
	Attempted bool
	// Interrupted counts that many interrupted attempts as well (Claimed.InterruptedAttempts): they may have
	// reached the provider, and the attempt log numbers them.
	Interrupted int
	// External is set for the outcome of an effect that happened outside the database (an email accepted, a
	// webhook answered): until it commits, a gateway killed resends the effect. A store that batches
	// (WithGroupCommit) never queues it behind other writes (batch.go).
	External bool
	// OnHandoff, when set, is called right before the statement that records the outcome is written to the
	// database, at every try. From then on, a gateway killed no longer loses the outcome: Postgres runs a
	// statement it has read whole, and commits it, though its client is gone (TestAnOutcomeHandedOffOutlivesItsGateway).
	// So it ends the crash window of an External outcome: the time from the destination's acceptance to
	// the handoff is what a SIGKILL can land in and cause a resend.
	OnHandoff func()
}

// Finish records a terminal outcome under lease: the outbox row goes and the effect takes its final status.
// It returns ErrLeaseLost, having changed nothing, when the lease is no longer the row's.
func (s *Store) Finish(ctx context.Context, lease Lease, f Finish) error {
	if !f.Status.Terminal() {
		return fmt.Errorf("dedup: finish with status %q, which is not terminal", f.Status)
	}
	if s.batcher != nil {
		return s.batcher.finish(ctx, lease, f)
	}
	return finishOne(ctx, s.db, lease, f)
}

// handOff runs write on db, calling onHandoff (when set) right before the write's statement goes out: on a
// pool, once a connection is held, so that the wait for one counts in the crash window that onHandoff ends.
// Nothing else is sent first on that connection when it is an outcome connection (PrepareOutcomes): the
// statement is prepared already.
func handOff(ctx context.Context, db DBTX, onHandoff func(), write func(DBTX) error) error {
	if onHandoff == nil {
		return write(db)
	}
	if p, ok := db.(*pgxpool.Pool); ok {
		c, err := p.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		onHandoff()
		return write(c)
	}
	onHandoff()
	return write(db)
}

// PrepareOutcomes prepares, on a connection that records outcomes (GroupCommit.Outcomes), the statements
// that record them, when the connection caches prepared statements (pgx's default mode): the first outcome
// on a connection then goes out in one write, not after a round trip to prepare it, which a gateway killed
// meanwhile would turn into a resend. A connection in another mode (exec mode, through a transaction-pooling
// PgBouncer, which loses prepared statements between transactions) needs and gets nothing.
func PrepareOutcomes(ctx context.Context, c *pgx.Conn) error {
	if c.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	for _, sql := range []string{pinSQL, finishSQL, finishBatchSQL} {
		// Named by its text, a prepared statement is the one pgx runs for that text (Conn.Query, SendBatch).
		if _, err := c.Prepare(ctx, sql, sql); err != nil {
			return fmt.Errorf("dedup: prepare the outcome statements: %w", err)
		}
	}
	// Then each runs once, recording nothing (effect 0 is no one's): a backend's first run of a statement
	// loads the catalog entries of the tables and indexes it touches and plans it, 4.7 ms for finish.sql on a
	// quiet machine against 0.5 ms by its third run, and tens of milliseconds under the load of a gateway's
	// start, when its first burst of outcomes would wait for it (a chaos run's resends all came from gateways
	// killed then, their first outcome statements taking 80 to 107 ms).
	var none int64
	if err := c.QueryRow(ctx, finishSQL, none, uuidArg([16]byte{}), effect.StatusDelivered, nil, nil, 0, false).
		Scan(&none); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("dedup: warm the outcome statements: %w", err)
	}
	if err := pinnedExec(ctx, c, finishBatchSQL, []int64{}, []string{}, []string{}, []*string{}, []*string{},
		[]int32{}, []bool{}); err != nil {
		return fmt.Errorf("dedup: warm the outcome statements: %w", err)
	}
	return nil
}

// finishOne records one Finish in a statement of its own.
func finishOne(ctx context.Context, db DBTX, lease Lease, f Finish) error {
	var id int64
	err := handOff(ctx, db, f.OnHandoff, func(db DBTX) error {
		return db.QueryRow(ctx, finishSQL, lease.EffectID, uuidArg(lease.Token), f.Status, nullJSON(storableJSON(f.Result)),
			nullString(storableText(f.LastError)), attempts(f.Attempted)+f.Interrupted, f.Status == effect.StatusDelivered).Scan(&id)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return translate("finish effect", err)
}

// FinishAll records the terminal outcomes of many leased rows in one statement, each under its own lease,
// and returns the IDs of the effects it recorded: a lease that was lost is left out, having changed nothing.
// It never batches with other callers: on a store from WithTx it writes in that transaction, which is how a
// TxProvider's effects commit with their records (LockLeases).
func (s *Store) FinishAll(ctx context.Context, leases []Lease, fs []Finish) (map[int64]bool, error) {
	if len(leases) != len(fs) {
		return nil, fmt.Errorf("dedup: %d leases for %d outcomes", len(leases), len(fs))
	}
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	return finishAll(ctx, s.db, leases, fs)
}

// LockLeases locks the outbox rows of the leases that are still held, for the rest of the store's
// transaction (use it on a store from WithTx), and returns their effect IDs. A locked row cannot be claimed
// or changed by anyone else until that transaction ends, so effects written in it for these rows, and
// FinishAll's records of them, commit only for leases that were held throughout: a TxProvider's batch
// fences all its rows with one statement rather than one transaction each.
func (s *Store) LockLeases(ctx context.Context, leases []Lease) (map[int64]bool, error) {
	ids, tokens := make([]int64, len(leases)), make([]string, len(leases))
	for i, l := range leases {
		ids[i], tokens[i] = l.EffectID, uuidText(l.Token)
	}
	rows, err := s.db.Query(ctx, lockLeasesSQL, ids, tokens)
	if err != nil {
		return nil, translate("lock leases", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, translate("lock leases", err)
	}
	out := make(map[int64]bool, len(held))
	for _, id := range held {
		out[id] = true
	}
	return out, nil
}

// Reschedule is a row going back to wait.
type Reschedule struct {
	// Delay is how long from now (by the database's clock) the row waits.
	Delay time.Duration
	// LastError replaces the stored error; empty keeps it.
	LastError string
	// Attempted counts the attempt: false when the row is handed back unattempted (breaker open, shutdown).
	Attempted bool
	// Interrupted counts that many interrupted attempts as well, as in Finish; the row's count starts again.
	Interrupted int
	// WhilePaused says that the row waits for its destination's pause, Delay being the pause's end as the
	// caller knew it: when the fleet's table holds no pause of the row's destination now (an operator lifted
	// it meanwhile), the row is due at once instead (reschedule.sql).
	WhilePaused bool
}

// Reschedule puts a leased row back to wait, and its effect back to pending, under lease. It returns
// ErrLeaseLost, having changed nothing, when the lease is no longer the row's.
func (s *Store) Reschedule(ctx context.Context, lease Lease, r Reschedule) error {
	var id int64
	err := s.db.QueryRow(ctx, rescheduleSQL, lease.EffectID, uuidArg(lease.Token), r.Delay.Milliseconds(),
		nullString(storableText(r.LastError)), attempts(r.Attempted)+r.Interrupted, effect.StatusPending, r.WhilePaused).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return translate("reschedule effect", err)
}

// Defer hands claimed rows back, unattempted and uncharged, each to wait its delay (by the database's clock),
// in one statement: rows a fleet-wide limit or a destination's pause keeps from their attempt now. A fresh
// row's effect goes back to pending; a rescued row stays rescued (release.sql). A row whose lease was lost is
// left alone.
//
// dests names each row's destination, for a row that does not name it yet. keep (nil: none) says which rows
// keep their place in the order of claims rather than wait their delay: those whose wait the claims keep
// themselves, a destination with no token or paused (defer.sql).
func (s *Store) Defer(ctx context.Context, rows []Claimed, delays []time.Duration, dests []string, keep []bool) error {
	a := leaseArgsOf(rows)
	ms := make([]int64, len(rows))
	for i := range rows {
		ms[i] = delays[i].Milliseconds()
	}
	if keep == nil {
		keep = make([]bool, len(rows))
	}
	_, err := s.db.Exec(ctx, deferSQL, a.ids, a.tokens, a.rescued, ms, dests, effect.StatusPending, keep,
		a.interruptedOwners)
	return translate("defer effects", err)
}

// ExtendLease makes lease run for d from now (by the database's clock), if the row is still under it: the
// token fences it as it fences Finish, so a lease that ran out is extended only when no one took the row
// since. A dispatcher that knows an outcome but cannot record it yet (the database is slow or coming back)
// keeps the row from being rescued, and resent, meanwhile. It returns ErrLeaseLost when the lease is no
// longer the row's.
func (s *Store) ExtendLease(ctx context.Context, lease Lease, d time.Duration) error {
	var id int64
	err := s.db.QueryRow(ctx, extendLeaseSQL, lease.EffectID, uuidArg(lease.Token), d.Milliseconds()).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	return translate("extend lease", err)
}

// Purge deletes up to limit effects that became terminal more than retention ago, and returns how many it
// deleted; their keys can be used again. Rows another purge holds are skipped, not waited for, so a caller
// loops until a batch comes back short.
func (s *Store) Purge(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	// Planned for its values and the tables' statistics of the moment (the simple protocol sends the values in
	// the text): a gateway's connections keep generic plans (gateway.newPool), and this one's, made on empty
	// tables, read every partition of the effects and the whole keys table to find a batch.
	tag, err := s.db.Exec(ctx, purgeSQL, pgx.QueryExecModeSimpleProtocol, retention.Milliseconds(), limit)
	if err != nil {
		return 0, translate("purge effects", err)
	}
	return tag.RowsAffected(), nil
}

// Backlog is the outbox of one effect type: rows waiting, and the age of the oldest one that is due.
type Backlog struct {
	Type      string
	Rows      int64
	OldestDue time.Duration
}

// Backlogs reads the outbox backlog per effect type.
func (s *Store) Backlogs(ctx context.Context) ([]Backlog, error) {
	rs, err := s.db.Query(ctx, backlogSQL)
	if err != nil {
		return nil, translate("read backlog", err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (Backlog, error) {
		var b Backlog
		var secs float64
		err := r.Scan(&b.Type, &b.Rows, &secs)
		b.OldestDue = time.Duration(secs * float64(time.Second))
		return b, err
	})
	if err != nil {
		return nil, translate("read backlog", err)
	}
	return out, nil
}

// uuidArg is a lease token as a query argument. pgx encodes a bare [16]byte only where the server described
// the parameter first (a prepared statement); pgtype.UUID names its type itself, in every mode.
func uuidArg(token [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: token, Valid: true} }

// Terminal returns which of the effects ids are terminal, in one statement: the waiting requests of a gateway
// poll this way when notifications are off or lost.
func (s *Store) Terminal(ctx context.Context, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var terminal []string
	for _, st := range effect.Statuses() {
		if st.Terminal() {
			terminal = append(terminal, string(st))
		}
	}
	rs, err := pinned(ctx, s.db, terminalSQL, ids, terminal)
	if err != nil {
		return nil, translate("read terminal effects", err)
	}
	out, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, translate("read terminal effects", err)
	}
	return out, nil
}

func attempts(attempted bool) int {
	if attempted {
		return 1
	}
	return 0
}

// nullJSON is a JSON document as a query argument, or NULL. As json.RawMessage it names its type (json); as
// []byte pgx's exec and simple protocol modes would send it as bytea.
func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return json.RawMessage(b)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// RestorePartitionKeys puts back the keys of a partition's effects that are on their way again (an outbox
// row) after FreePartitionKeys freed them and the partition's retirement stopped (package partitions calls
// it when it keeps the partition, or attaches it again): a retried effect holds its key until it is done. A
// key taken by a new effect since stays that effect's. lower and upper are the partition's id range. Returns
// how many were put back.
func RestorePartitionKeys(ctx context.Context, conn *pgx.Conn, partition string, lower, upper int64) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, strings.ReplaceAll(restoreKeysSQL, "{{partition}}", pgx.Identifier{partition}.Sanitize()),
		lower, upper).Scan(&n)
	return n, translate("restore the keys of "+partition, err)
}

// freeKeyBatch is how many of a partition's effects one statement of free_keys.sql takes: a statement of a
// few milliseconds (2.5 on a quiet machine), whose row locks on keys a create waits for no longer than that.
const freeKeyBatch = 500

// freeKeyPause is the pause after each batch, in multiples of the time the batch took: freeing keys is the
// one row-by-row work of retirement, and Postgres gives accepts at least three quarters of its time while it
// runs (a pause as long as the batch gave them half: accept p99 1.46x during a retirement in `scripts/bench
// retention`).
const freeKeyPause = 3

// FreePartitionKeys frees the keys that point at the effects of partition, a partition of oncegate_effects
// about to be retired (package partitions calls it, on its own connection, before the detach): each key still
// pointing at its effect is deleted and can be claimed again as a new key. held: a key was found whose expiry
// has not passed (a retention made shorter since it was claimed), or whose effect is on its way again or
// finished less than retention ago (an operator retried it since the partition was found past retention),
// and the partition must stay; the keys freed before it stay freed, having expired with their effects done.
// Batch by batch, each its own transaction, and after each a pause (freeKeyPause) that spreads the work.
func FreePartitionKeys(ctx context.Context, conn *pgx.Conn, partition string, retention time.Duration) (freed int64,
	held bool, err error) {
	q := strings.ReplaceAll(freeKeysSQL, "{{partition}}", pgx.Identifier{partition}.Sanitize())
	var last int64 = math.MinInt64
	for {
		var next *int64
		var n int64
		began := time.Now()
		if err := conn.QueryRow(ctx, q, last, freeKeyBatch, retention.Milliseconds()).Scan(&next, &held, &n); err != nil {
			return freed, false, translate("free the keys of "+partition, err)
		}
		freed += n
		if held || next == nil {
			return freed, held, nil
		}
		last = *next
		pause := time.NewTimer(freeKeyPause * time.Since(began))
		select {
		case <-ctx.Done():
			pause.Stop()
			return freed, false, ctx.Err()
		case <-pause.C:
		}
	}
}
