// Package notifier is the gateways' one LISTEN connection, and the one place that names their Postgres
// notification channels. Subscribers register a callback per topic; the notifier holds a connection that
// LISTENs to every subscribed topic and calls the callbacks as notifications arrive.
//
// Its guarantee is about the notifications it cannot deliver: Postgres drops the notifications sent while a
// listener has no connection, so after every (re)connect each subscriber is called once with Resync set, and
// must then act as if anything it waits for may have happened (re-read, wake its waiters). A connection that
// a network fault left dead without an error (a blackhole) is found by a ping after an idle slice, not after
// the operating system's keepalive gives up; one on a server that no longer passes the URL's
// target_session_attrs (a primary demoted in a failover) is found by the same check, and the listener moves
// to the URL's host that does. Notifications are a way to be quick, never the only way to be
// right: every subscriber also polls.
//
// A LISTEN only works on a connection of its own: behind PgBouncer in transaction pooling mode it lands on a
// pooled server connection, whose notifications nobody reads, and nothing fails. Check proves the way round
// (a notification sent through the caller's pool arrives here), and Batcher sends notifications outside the
// transactions they announce, at most one per topic every few milliseconds.
package notifier

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/backoff"
)

// Topic is a notification channel.
type Topic string

const (
	// TopicOutbox is sent when an outbox row is due (a new effect, an operator's retry). Payload: the effect
	// type. Dispatchers wake on it.
	TopicOutbox Topic = "oncegate_outbox"
	// TopicEffectDone is sent when effects became terminal. Payload: their IDs, comma-separated (SplitIDs).
	// Requests waiting on an effect wake on it.
	TopicEffectDone Topic = "oncegate_effect_done"
	// TopicSelfCheck carries Check's notifications. Payload: the token of the check that sent it. Every
	// notifier listens to it.
	TopicSelfCheck Topic = "oncegate_selfcheck"
)

// MaxPayload is the longest payload Send accepts: Postgres refuses 8000 bytes and more.
const MaxPayload = 7999

// DefaultIdleCheck is how long the listener waits for a notification before it pings its connection.
const DefaultIdleCheck = 15 * time.Second

// applicationName marks the listener's connection in pg_stat_activity.
const applicationName = "oncegate_notifier"

//go:embed sql/notify.sql
var notifySQL string

// Notification is what a subscriber is called with.
type Notification struct {
	Topic   Topic
	Payload string
	// Resync is set, with an empty Payload, after each (re)connect: notifications sent while the listener had
	// no connection are lost, so the subscriber should assume that whatever it waits for may have happened.
	Resync bool
}

// Config configures a Notifier.
type Config struct {
	// DatabaseURL is where to LISTEN: a direct or session-mode connection. Required. Parameters of a pgxpool
	// (pool_max_conns, …) are allowed and ignored.
	DatabaseURL string
	// IdleCheck is how long to wait for a notification before pinging the connection. Defaults to
	// DefaultIdleCheck.
	IdleCheck time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Notifier holds the LISTEN connection. Create it with New, Subscribe, then Run.
type Notifier struct {
	cfg Config

	mu      sync.Mutex
	subs    map[Topic][]func(Notification)
	running bool
	// up is closed while a LISTEN connection runs, and replaced by an open one when it is lost.
	up     chan struct{}
	isUp   bool
	checks map[string]chan struct{} // Check's tokens in flight
}

// New returns a notifier; it connects when Run is called.
func New(cfg Config) *Notifier {
	if cfg.IdleCheck <= 0 {
		cfg.IdleCheck = DefaultIdleCheck
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("component", "notifier")
	n := &Notifier{cfg: cfg, subs: map[Topic][]func(Notification){}, up: make(chan struct{}),
		checks: map[string]chan struct{}{}}
	n.subs[TopicSelfCheck] = []func(Notification){n.checked}
	return n
}

// Subscribe calls fn for every notification on topic, and with Resync after every (re)connect. fn runs on
// the listener's goroutine: it must be quick and must not block. Subscribe must be called before Run, which
// LISTENs to the topics subscribed by then.
func (n *Notifier) Subscribe(topic Topic, fn func(Notification)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running {
		panic("notifier: Subscribe after Run")
	}
	n.subs[topic] = append(n.subs[topic], fn)
}

// Run listens until ctx ends, reconnecting with backoff whenever the connection fails.
func (n *Notifier) Run(ctx context.Context) {
	n.mu.Lock()
	n.running = true
	n.mu.Unlock()
	var failures int
	for ctx.Err() == nil {
		err := n.listen(ctx, func() { failures = 0 })
		n.setUp(false)
		if ctx.Err() != nil {
			return
		}
		failures++
		d := backoff.Policy{Base: 200 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
		n.cfg.Logger.Warn("notification listener lost its connection; reconnecting", "err", err, "in", d.String())
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// setUp records whether a LISTEN connection runs, for Check.
func (n *Notifier) setUp(up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if up == n.isUp {
		return
	}
	n.isUp = up
	if up {
		close(n.up)
	} else {
		n.up = make(chan struct{})
	}
}

func (n *Notifier) listen(ctx context.Context, connected func()) error {
	// Parsed as a pool's URL, so that pool parameters are taken off rather than sent to the server, which
	// refuses them.
	pcfg, err := pgxpool.ParseConfig(n.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	ccfg := pcfg.ConnConfig
	ccfg.RuntimeParams["application_name"] = applicationName
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, ccfg)
	cancel()
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for topic := range n.subs {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{string(topic)}.Sanitize()); err != nil {
			return err
		}
	}
	connected()
	n.setUp(true)
	for topic, fns := range n.subs {
		for _, fn := range fns {
			fn(Notification{Topic: topic, Resync: true})
		}
	}
	for {
		// Wait in slices and ping when idle: a connection that a network fault left dead without an error is
		// found and replaced within a slice.
		wctx, cancel := context.WithTimeout(ctx, n.cfg.IdleCheck)
		msg, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			if err == nil && ccfg.ValidateConnect != nil {
				// A server demoted in a failover lives on, read-only, and the NOTIFYs go to the new primary:
				// target_session_attrs (read-write, primary) is checked again, not only at connect.
				if verr := ccfg.ValidateConnect(pctx, conn.PgConn()); verr != nil {
					err = fmt.Errorf("its server no longer passes target_session_attrs (demoted in a failover?): %w", verr)
				}
			}
			cancel()
			if err != nil {
				return fmt.Errorf("idle connection failed its check: %w", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		topic := Topic(msg.Channel)
		for _, fn := range n.subs[topic] {
			fn(Notification{Topic: topic, Payload: msg.Payload})
		}
	}
}

// Execer is a pool, a connection or a transaction; a notification sent in a transaction is delivered when it
// commits.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Send notifies topic's listeners in every gateway of the database.
func Send(ctx context.Context, db Execer, topic Topic, payload string) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("notifier: payload of %d bytes on %s is over %d", len(payload), topic, MaxPayload)
	}
	if _, err := db.Exec(ctx, notifySQL, string(topic), payload); err != nil {
		return fmt.Errorf("notifier: notify %s: %w", topic, err)
	}
	return nil
}

// join packs items, comma-separated, into as few payloads as fit under MaxPayload.
func join(items []string) []string {
	var out []string
	var b strings.Builder
	for _, s := range items {
		if b.Len() > 0 && b.Len()+1+len(s) > MaxPayload {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// SplitIDs reads a TopicEffectDone payload; fields that are not IDs are skipped.
func SplitIDs(payload string) []int64 {
	var ids []int64
	for _, f := range strings.Split(payload, ",") {
		if id, err := strconv.ParseInt(f, 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}
