package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/effect"
)

// Group commit.
//
// One request, one transaction, one commit: the commit's WAL flush, and a statement's round trip and
// planning, cap a gateway's accepts below what Postgres can do. Postgres cannot merge the commits of
// independent clients, but the gateway can: requests that arrive while a batch is being recorded wait for the
// next batch, which records all of them in one statement (insert_batch.sql) and one commit. A request that
// arrives when fewer than Parallel batches are in flight starts one at once, so a lone request never waits
// for company; the batches grow with the load, up to MaxBatch.
//
// A request is answered only from the result of the commit that holds its row: a 202 is durable. A batch
// that fails for a reason one of its requests may cause is not allowed to fail the others: its requests are
// recorded one by one, each getting the answer it would have got alone.

// GroupCommit configures the batching of Create.
type GroupCommit struct {
	// MaxBatch is the largest number of requests recorded in one statement. 0 or 1 turns batching off.
	MaxBatch int
	// Parallel is how many batches may be in flight at once (each holds a connection). At least 1.
	Parallel int
	// Timeout bounds one batch's statement: a batch outlives the requests that wait for it (one may give up
	// while the others still want their answer), so it cannot use their contexts.
	Timeout time.Duration
	// Outcomes, when set, records the External Finishes: connections of their own (a pool of 4×Parallel,
	// as many as Finishes may have in flight, kept open), so that an outcome waits neither for a connection
	// that accepts, claims and waits hold, nor for one to be opened. Until its statement is written, a gateway killed resends the
	// effect: a chaos run saw an outcome wait 42 ms for a connection of a gateway just restarted, and then
	// be lost with it.
	Outcomes DBTX
}

// Defaults of GroupCommit. Two batches in flight, not more: each statement costs Postgres a fixed few hundred
// microseconds of CPU (its commit above all) whatever its size, so on a machine whose cores Postgres shares,
// more statements in flight made smaller batches and fewer accepts (with 4, at 8 clients, 1.4 requests a
// statement and half the accepts of 2); and one statement in flight would leave the other idle while the
// first waits for its WAL flush, or on a row lock a fenced request holds.
const (
	DefaultMaxBatch      = 128
	DefaultBatchParallel = 2
	DefaultBatchTimeout  = 10 * time.Second
)

// DefaultGroupCommit is what a gateway uses unless configured otherwise.
var DefaultGroupCommit = GroupCommit{MaxBatch: DefaultMaxBatch, Parallel: DefaultBatchParallel,
	Timeout: DefaultBatchTimeout}

// WithGroupCommit returns a store whose unfenced Creates are recorded in batches. Only a store on a pool can
// batch: each batch runs in a transaction of its own.
func (s *Store) WithGroupCommit(gc GroupCommit) *Store {
	if gc.MaxBatch <= 1 {
		return &Store{db: s.db, retention: s.retention, apart: s.apart, follow: s.follow}
	}
	gc.Parallel = max(gc.Parallel, 1)
	if gc.Timeout <= 0 {
		gc.Timeout = DefaultBatchTimeout
	}
	return &Store{db: s.db, retention: s.retention, apart: s.apart, follow: s.follow, batcher: newBatcher(s.db, gc)}
}

// finishDB is where Finishes are recorded: the Outcomes connections for a batch that holds an External
// one, when there are such.
func (b *batcher) finishDB(external bool) DBTX {
	if external && b.outcomes != nil {
		return b.outcomes
	}
	return b.db
}

// BatchStats is what the batcher has done since it started.
type BatchStats struct {
	Batches  int64 // statements run
	Requests int64 // requests recorded in them
	Largest  int   // the largest batch
	Split    int64 // batches that failed and were recorded one by one
}

// BatchStats returns the counts of the batched Creates and Finishes; zero when the store does not batch.
func (s *Store) BatchStats() (creates, finishes BatchStats) {
	if s.batcher == nil {
		return BatchStats{}, BatchStats{}
	}
	return s.batcher.creates.snapshot(), s.batcher.finishes.snapshot()
}

// group is the queue and the slots of one kind of batched write: what arrives waits, and whenever one of
// Parallel slots is free, up to MaxBatch of what waits goes to run, in a goroutine of its own.
//
// An urgent item (the outcome of an effect that happened outside the database: until it commits, a gateway
// killed resends the effect) is never queued behind other work: it goes before every item that is not
// urgent, first in the next statement, and when the Parallel slots are busy it has reserve slots more, for a
// statement of its own at once rather than a wait for a statement to end and the next to run.
//
// The statements that carry urgent items go out on connections of their own (GroupCommit.Outcomes), and
// never more of them at once than those connections open: one beyond them would wait for a connection to be
// dialled, 100 to 300 ms on a busy 2-core machine, where in the queue it goes out, with every urgent item
// that came meanwhile, as soon as the first statement in flight ends. A chaos run's gateways, just
// restarted with 4 of their 5 outcome connections open, held the fifth outcome of a burst for a dial, and
// were killed meanwhile: every resend of that run. The connections that are missing are dialled in the
// background (grow).
type group[T any] struct {
	cfg     GroupCommit
	reserve int                          // slots beyond Parallel that only urgent items may use
	run     func(batch []T)              // answers every item of the batch
	open    func() int                   // how many urgent statements the open connections carry at once; nil: no bound
	grow    func(done func(opened bool)) // has a connection opened, or waits for one to be free, then calls done

	mu       sync.Mutex
	waiting  []T // the urgent first
	urgent   int // how many of waiting are urgent
	inflight int
	urgentIn int  // statements in flight that carry urgent items
	growing  bool // a grow is under way: one at a time
	// dialFailed is set when a grow could not open a connection, until one is open for the urgent again.
	dialFailed bool
	stats      BatchStats
}

// add queues an item and starts a batch when a slot is free: at once, when nothing else is in flight.
func (g *group[T]) add(item T) { g.addItem(item, false) }

// addItem queues an item, an urgent one after the urgent ones waiting and before the rest.
func (g *group[T]) addItem(item T, urgent bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if urgent {
		g.waiting = slices.Insert(g.waiting, g.urgent, item)
		g.urgent++
	} else {
		g.waiting = append(g.waiting, item)
	}
	g.startLocked()
}

func (g *group[T]) startLocked() {
	if len(g.waiting) == 0 {
		return
	}
	urgentGoes := g.urgent > 0 && g.connectionFreeLocked()
	from, n := 0, min(len(g.waiting), g.cfg.MaxBatch)
	switch {
	case g.inflight < g.cfg.Parallel && (g.urgent == 0 || urgentGoes):
	case urgentGoes && g.inflight < g.cfg.Parallel+g.reserve:
		n = min(n, g.urgent) // a reserve slot carries urgent items only
	case g.inflight < g.cfg.Parallel && len(g.waiting) > g.urgent:
		// The urgent wait for a connection of theirs; the rest need none of those.
		from, n = g.urgent, min(len(g.waiting)-g.urgent, g.cfg.MaxBatch)
	default:
		return
	}
	batch := make([]T, n)
	copy(batch, g.waiting[from:])
	g.waiting = slices.Delete(g.waiting, from, from+n)
	carriesUrgent := from == 0 && g.urgent > 0
	if carriesUrgent {
		g.urgent -= min(n, g.urgent)
		g.urgentIn++
	}
	g.inflight++
	g.stats.Batches++
	g.stats.Requests += int64(n)
	g.stats.Largest = max(g.stats.Largest, n)
	go func() {
		defer func() {
			g.mu.Lock()
			g.inflight--
			if carriesUrgent {
				g.urgentIn--
			}
			g.startLocked()
			g.mu.Unlock()
		}()
		g.run(batch)
	}()
}

// connectionFreeLocked says whether one more statement carrying urgent items has an open connection to go
// out on, and when it has none, has one dialled in the background (or, the pool full, waits for one to end).
func (g *group[T]) connectionFreeLocked() bool {
	if g.open == nil {
		return true
	}
	if g.urgentIn < g.open() {
		g.dialFailed = false
		return true
	}
	if g.dialFailed {
		// The database refused the last dial: the urgent go out as before, each statement dialling for itself
		// and failing fast, so that their callers try again (record) rather than wait in the queue for a
		// connection that may not come while their leases run.
		return true
	}
	if g.grow != nil && !g.growing {
		g.growing = true
		g.grow(func(opened bool) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.growing = false
			g.dialFailed = !opened
			g.startLocked()
		})
	}
	return false
}

// claimInline takes a slot for one item that its caller records itself, in a statement of its own, when
// nothing waits and a slot is free: a lone request pays no hand-off to a goroutine and no batch statement.
// An urgent item needs only that no urgent item waits, and may take a reserve slot.
func (g *group[T]) claimInline(urgent bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	limit := g.cfg.Parallel
	if urgent {
		limit += g.reserve
	}
	if (urgent && g.urgent > 0) || (!urgent && len(g.waiting) > 0) || g.inflight >= limit {
		return false
	}
	if urgent {
		if !g.connectionFreeLocked() {
			return false
		}
		g.urgentIn++
	}
	g.inflight++
	g.stats.Batches++
	g.stats.Requests++
	g.stats.Largest = max(g.stats.Largest, 1)
	return true
}

// releaseInline gives back a slot taken by claimInline, and starts a batch of what waits.
func (g *group[T]) releaseInline(urgent bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if urgent {
		g.urgentIn--
	}
	g.startLocked()
}

func (g *group[T]) split() {
	g.mu.Lock()
	g.stats.Split++
	g.mu.Unlock()
}

func (g *group[T]) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}

func (g *group[T]) snapshot() BatchStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// batcher records Creates, and the dispatcher's Finishes, in batches.
type batcher struct {
	db       DBTX
	outcomes DBTX // nil: Finishes share db
	timeout  time.Duration
	// tries is how many times a Finish may meet a connection closed under it (onLiveConnection), per pool:
	// taken once, since pgxpool's Config copies the whole configuration at every call.
	tries    map[DBTX]int
	creates  *group[*insertion]
	finishes *group[*finishing]
}

func newBatcher(db DBTX, gc GroupCommit) *batcher {
	b := &batcher{db: db, outcomes: gc.Outcomes, timeout: gc.Timeout, tries: map[DBTX]int{}}
	for _, p := range []DBTX{db, gc.Outcomes} {
		if pool, ok := p.(*pgxpool.Pool); ok {
			b.tries[p] = int(pool.Config().MaxConns) + 1
		}
	}
	b.creates = &group[*insertion]{cfg: gc, run: b.run}
	// Urgent Finishes may have three times Parallel statements more in flight: their crash window ends when
	// their statement is written (Finish.OnHandoff), so one that waits for a slot keeps it open. With one
	// reserve slot per Parallel, under a load that kept both cores busy, half the outcomes waited 1.5 ms
	// for a slot (p50 of oncegate_outcome_handoff_seconds); with three, 0.02–0.3 ms.
	reserve := 3 * gc.Parallel
	// Never more urgent statements in flight than outcome connections, and of those only the ones open (see
	// group): one beyond them waits for a connection to come free, or to be dialled, and then carries its
	// own outcome alone, where waiting in the group it goes, with every outcome that came meanwhile, in the
	// next statement. A chaos run's gateways, with 3 outcome connections (their pools sized to share
	// Postgres) and 8 slots, held outcomes for a connection 20 to 900 ms under a load that kept statements
	// at 10 to 40 ms.
	b.finishes = &group[*finishing]{cfg: gc, reserve: reserve, run: b.runFinishes}
	if p, ok := gc.Outcomes.(*pgxpool.Pool); ok {
		b.finishes.reserve = max(0, int(p.Config().MaxConns)-gc.Parallel)
		b.finishes.open = func() int {
			st := p.Stat()
			return int(st.TotalConns() - st.ConstructingConns())
		}
		// An Acquire with no connection idle dials one when the pool may grow, or waits for one being dialled
		// or carrying a statement; its Release leaves the connection open and idle for the urgent.
		b.finishes.grow = func(done func(opened bool)) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), growFor)
				defer cancel()
				c, err := p.Acquire(ctx)
				if err == nil {
					c.Release()
				}
				done(err == nil)
			}()
		}
	}
	return b
}

// onLiveConnection runs a write on a pool and runs it again at once, on another connection, when the one it
// met had been closed by the server before the write could run on it: the outcome connections are taken
// without a ping (the gateway's outcome pool), so after a restart of Postgres or an idle_session_timeout every
// idle one is dead, and each try of record used to meet the next of them only after its back-off, 35 to 360
// ms in all inside the crash window (an adversary's finding). Each dead connection leaves the pool as it
// fails, so the pool's size in tries reaches a connection dialled anew; a dial that fails is not a closed
// connection, and ends the tries. The write is fenced by its lease token, so a try that did run after all
// makes the next one answer ErrLeaseLost, never a second record.
func (b *batcher) onLiveConnection(db DBTX, write func() error) error {
	tries := max(1, b.tries[db])
	var err error
	for range tries {
		if err = write(); err == nil || !closedBeforeUse(err) {
			return err
		}
	}
	return err
}

// growFor bounds a dial of one more outcome connection in the background.
const growFor = 10 * time.Second

// finishing is one Finish waiting for the batch that records it.
type finishing struct {
	lease Lease
	f     Finish
	done  chan error // buffered; ErrLeaseLost when the lease was not the row's
}

// finish records f under lease through a batch.
func (b *batcher) finish(ctx context.Context, lease Lease, f Finish) error {
	if b.finishes.claimInline(f.External) {
		defer b.finishes.releaseInline(f.External)
		db := b.finishDB(f.External)
		return b.onLiveConnection(db, func() error { return finishOne(ctx, db, lease, f) })
	}
	fin := &finishing{lease: lease, f: f, done: make(chan error, 1)}
	b.finishes.addItem(fin, f.External)
	select {
	case err := <-fin.done:
		return err
	case <-ctx.Done():
		// The batch may still record it. Its wait ran out as a statement's would: a database that is slow or
		// away is unavailable to the caller (translate), who may try again under the same lease; a bare
		// context error made the dispatcher give up at once and leave the row to be rescued and resent.
		return translate("finish effect", ctx.Err())
	}
}

// runFinishes records a batch of Finishes in one statement; when that fails, one by one, so that each gets
// its own error.
func (b *batcher) runFinishes(batch []*finishing) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	if len(batch) > 1 {
		if err := b.finishMany(ctx, batch); err == nil {
			return
		}
		b.finishes.split()
	}
	var wg sync.WaitGroup
	for _, fin := range batch {
		db := b.finishDB(fin.f.External)
		wg.Go(func() {
			fin.done <- b.onLiveConnection(db, func() error { return finishOne(ctx, db, fin.lease, fin.f) })
		})
	}
	wg.Wait()
}

// finishMany runs finish_batch.sql and answers every Finish of the batch, or none and returns the error.
func (b *batcher) finishMany(ctx context.Context, batch []*finishing) error {
	leases, fs := make([]Lease, len(batch)), make([]Finish, len(batch))
	external := false
	for i, fin := range batch {
		leases[i], fs[i] = fin.lease, fin.f
		external = external || fin.f.External
	}
	db := b.finishDB(external)
	var recorded map[int64]bool
	err := b.onLiveConnection(db, func() (err error) {
		recorded, err = finishAll(ctx, db, leases, fs)
		return err
	})
	if err != nil {
		return err
	}
	for _, fin := range batch {
		if recorded[fin.lease.EffectID] {
			fin.done <- nil
		} else {
			fin.done <- ErrLeaseLost
		}
	}
	return nil
}

// finishAll records many Finishes in one statement (finish_batch.sql) and says which were recorded: a lease
// that was lost is left out, having changed nothing.
func finishAll(ctx context.Context, db DBTX, leases []Lease, fs []Finish) (map[int64]bool, error) {
	n := len(leases)
	ids, tokens, statuses := make([]int64, n), make([]string, n), make([]string, n)
	results, lastErrors, tries, delivered := make([]*string, n), make([]*string, n), make([]int32, n), make([]bool, n)
	for i, f := range fs {
		if !f.Status.Terminal() {
			return nil, fmt.Errorf("dedup: finish with status %q, which is not terminal", f.Status)
		}
		ids[i], tokens[i], statuses[i] = leases[i].EffectID, uuidText(leases[i].Token), string(f.Status)
		if r := storableJSON(f.Result); len(r) > 0 {
			s := string(r)
			results[i] = &s
		}
		if e := storableText(f.LastError); e != "" {
			lastErrors[i] = &e
		}
		tries[i], delivered[i] = int32(attempts(f.Attempted)+f.Interrupted), f.Status == effect.StatusDelivered
	}
	var handoffs []func()
	for _, f := range fs {
		if f.OnHandoff != nil {
			handoffs = append(handoffs, f.OnHandoff)
		}
	}
	var onHandoff func()
	if len(handoffs) > 0 {
		onHandoff = func() {
			for _, h := range handoffs {
				h()
			}
		}
	}
	var done []int64
	err := handOff(ctx, db, onHandoff, func(db DBTX) error {
		rows, err := pinned(ctx, db, finishBatchSQL, ids, tokens, statuses, results, lastErrors, tries, delivered)
		if err != nil {
			return err
		}
		done, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, translate("finish effects", err)
	}
	recorded := make(map[int64]bool, len(done))
	for _, id := range done {
		recorded[id] = true
	}
	return recorded, nil
}

// uuidText writes a lease token as Postgres reads a uuid.
func uuidText(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// insertion is one request waiting for the batch that records it.
type insertion struct {
	ne       NewEffect
	fp       []byte
	trace    json.RawMessage
	stableID string
	// retention is the key's, in milliseconds (Store.keyRetention): each request's own, as a batch may hold
	// the requests of stores that share a batcher (WithRetention).
	retention int64
	hold      int64 // the key's hold after its effect finished, in milliseconds (Store.keyHold)
	apart     bool  // its body goes to oncegate_effect_bodies (Store.WithBodiesApart)
	span      trace.SpanContext
	done      chan insertResult // buffered: the batch never waits for a request that gave up
}

type insertResult struct {
	created  *Effect // the request's row was inserted
	existing *Effect // the key was taken: the effect stored under it (nil when it was purged meanwhile)
	err      error
}

// insert records one request through a batch. It returns the new effect, or the effect already stored under
// the key, or neither when the key was taken by an effect that retention purged before it could be read.
func (b *batcher) insert(ctx context.Context, in *insertion) (created, existing *Effect, err error) {
	in.done = make(chan insertResult, 1)
	in.span = trace.SpanContextFromContext(ctx)
	b.creates.add(in)
	select {
	case r := <-in.done:
		return r.created, r.existing, r.err
	case <-ctx.Done():
		// The batch may still commit this row: the request's client learns of it as a replay when it tries
		// again, as it would after a connection lost between the commit and the answer.
		return nil, nil, ctx.Err()
	}
}

// run records a batch of Creates and answers each.
func (b *batcher) run(batch []*insertion) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	links := make([]trace.Link, 0, len(batch))
	for _, in := range batch {
		if in.span.IsValid() {
			links = append(links, trace.Link{SpanContext: in.span})
		}
	}
	ctx, span := tracer.Start(ctx, "dedup.record_batch", trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("batch.size", len(batch))))
	defer span.End()
	if unanswered, err := b.record(ctx, batch); err != nil {
		// Any of the requests may be at fault (a row Postgres refuses), or none (the connection): recorded
		// one by one, each request gets its own answer, and an unrelated one is not failed by another's.
		b.creates.split()
		span.SetAttributes(attribute.Bool("batch.split", true))
		var wg sync.WaitGroup
		for _, in := range unanswered {
			wg.Go(func() {
				if _, err := b.record(ctx, []*insertion{in}); err != nil {
					in.done <- insertResult{err: err}
				}
			})
		}
		wg.Wait()
	}
}

// record inserts the batch in one statement and answers the requests whose rows it created (their commit is
// done); then it reads back, in one more statement, the effects of the keys that were taken, and answers
// those. On an error it returns the requests it has not answered.
func (b *batcher) record(ctx context.Context, batch []*insertion) (unanswered []*insertion, err error) {
	created, stored, err := b.insertMany(ctx, batch)
	if err != nil {
		return batch, err
	}
	var taken []*insertion
	for _, in := range batch {
		if e := created[in.stableID]; e != nil {
			in.done <- insertResult{created: e}
		} else if e := stored[[2]string{in.ne.Tenant, in.ne.Key}]; e != nil {
			in.done <- insertResult{existing: e}
		} else {
			taken = append(taken, in)
		}
	}
	if len(taken) == 0 {
		return nil, nil
	}
	existing, err := b.getMany(ctx, taken)
	if err != nil {
		return taken, err
	}
	for _, in := range taken {
		in.done <- insertResult{existing: existing[[2]string{in.ne.Tenant, in.ne.Key}]}
	}
	return nil, nil
}

// jsonList is ss as a JSON array for insert_batch.sql, or nil (NULL) when it is empty.
func jsonList(ss []string) *string {
	if len(ss) == 0 {
		return nil
	}
	b, _ := json.Marshal(ss)
	s := string(b)
	return &s
}

// insertMany runs insert_batch.sql and returns the created effects by stable id, and the effects stored
// before under the batch's other keys by tenant and key.
func (b *batcher) insertMany(ctx context.Context, batch []*insertion) (created map[string]*Effect,
	stored map[[2]string]*Effect, err error) {
	n := len(batch)
	tenants, keys, types := make([]string, n), make([]string, n), make([]string, n)
	fps, payloads, traces, ids := make([][]byte, n), make([]string, n), make([]*string, n), make([]string, n)
	tags, terms, dests := make([]*string, n), make([]*string, n), make([]*string, n)
	retentions, holds, apart := make([]int64, n), make([]int64, n), make([]bool, n)
	for i, in := range batch {
		retentions[i], holds[i], apart[i] = in.retention, in.hold, in.apart
		dests[i] = orNil(in.ne.Destination)
		tenants[i], keys[i], types[i], fps[i], payloads[i], ids[i] = in.ne.Tenant, in.ne.Key, in.ne.Type, in.fp,
			string(in.ne.Payload), in.stableID
		if in.trace != nil {
			t := string(in.trace)
			traces[i] = &t
		}
		tags[i], terms[i] = jsonList(in.ne.Tags), jsonList(in.ne.Terms)
	}
	rows, err := b.db.Query(ctx, insertBatchSQL, tenants, keys, types, fps, payloads, traces, ids, tags, terms, dests,
		retentions, apart, holds)
	if err != nil {
		return nil, nil, err
	}
	created, stored = make(map[string]*Effect, n), map[[2]string]*Effect{}
	for rows.Next() {
		e, isNew, err := scanCreated(rows)
		if err != nil {
			rows.Close()
			return nil, nil, err
		}
		if isNew {
			created[e.StableID] = e
		} else {
			stored[[2]string{e.Tenant, e.Key}] = e
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	return created, stored, nil
}

// getMany reads the effects stored under the batch's keys.
func (b *batcher) getMany(ctx context.Context, batch []*insertion) (map[[2]string]*Effect, error) {
	tenants, keys := make([]string, len(batch)), make([]string, len(batch))
	for i, in := range batch {
		tenants[i], keys[i] = in.ne.Tenant, in.ne.Key
	}
	rows, err := b.db.Query(ctx, getBatchSQL, tenants, keys)
	if err != nil {
		return nil, err
	}
	effects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Effect, error) { return scan(r) })
	if err != nil {
		return nil, err
	}
	out := make(map[[2]string]*Effect, len(effects))
	for _, e := range effects {
		out[[2]string{e.Tenant, e.Key}] = e
	}
	return out, nil
}
