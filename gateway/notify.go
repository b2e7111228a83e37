package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/notifier"
	"github.com/oncegate/oncegate/outbox"
)

// waiters are requests waiting for effects to become terminal.
type waiters struct {
	mu sync.Mutex
	m  map[int64][]chan struct{}
}

func newWaiters() *waiters { return &waiters{m: map[int64][]chan struct{}{}} }

// notified wakes the waiters of the effects another gateway finished (notifier.TopicEffectDone), or every
// waiter after the notifier reconnected, since the notifications sent meanwhile are lost.
func (w *waiters) notified(n notifier.Notification) {
	if n.Resync {
		w.wakeAll()
		return
	}
	for _, id := range notifier.SplitIDs(n.Payload) {
		w.wake(id)
	}
}

// add returns a channel closed when effect id may have changed, and a function that forgets it.
func (w *waiters) add(id int64) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[id] = append(w.m[id], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[id]
		for i, c := range list {
			if c == ch {
				w.m[id] = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(w.m[id]) == 0 {
			delete(w.m, id)
		}
	}
}

func (w *waiters) wake(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[id] {
		close(ch)
	}
	delete(w.m, id)
}

func (w *waiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, list := range w.m {
		for _, ch := range list {
			close(ch)
		}
		delete(w.m, id)
	}
}

// announce tells the dispatchers of a new effect, once its transaction has committed. This gateway's claims
// it at once by its ID when its tenant has nothing of the type in flight here (outbox.Dispatcher.Created), and
// the others need not hear of it. Otherwise this gateway's claim loop is woken in-process, and the others' by
// a notification that the batcher sends with the other new effects' (at most one every notifyInterval). A
// crash in between costs the others a poll interval.
func (g *Gateway) announce(e *dedup.Effect, tenant string, payload json.RawMessage) {
	if g.dispatcher.Created(outbox.NewEffect{ID: e.ID, Tenant: tenant, Key: e.Key, Type: e.Type, Stable: e.StableID,
		CreatedAt: e.CreatedAt, Payload: payload}) {
		return
	}
	g.dispatcher.WakeType(e.Type)
	g.newEffects.Add(e.Type)
}

// ids lists the effects that requests wait for.
func (w *waiters) ids() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int64, 0, len(w.m))
	for id := range w.m {
		out = append(out, id)
	}
	return out
}

const (
	// selfCheckTimeout is how long the notification self-check waits for its notification to arrive.
	selfCheckTimeout = 5 * time.Second
	// selfCheckEvery is how often the self-check runs again, and after every reconnect of the listener.
	selfCheckEvery = time.Minute
	// notifyInterval is the least time between two notifications of new effects from one gateway.
	notifyInterval = 5 * time.Millisecond
)

// listen runs the gateway's LISTEN connection and proves, with a self-check, that the other gateways'
// notifications arrive on it; until one has, and whenever one fails, the gateway counts notifications as off
// and polls every dispatcher.fallback_poll_interval (poll). Without listen_url it listens on database_url,
// unless that goes through a pooler, where a LISTEN would land on a pooled server connection: then
// notifications stay off, and it says so.
func (g *Gateway) listen(ctx context.Context) {
	url, where := g.cfg.ListenURL, "listen_url"
	if url == "" {
		for {
			pooled, err := g.probe.Pooled(ctx)
			if err == nil && pooled {
				g.log.Warn("notifications are off: database_url goes through a connection pooler and listen_url "+
					"is not set; polling instead, which adds up to this to every delivery and wait. Set listen_url "+
					"to a direct or session-mode connection to have them", "poll_interval",
					time.Duration(g.cfg.Dispatcher.FallbackPollInterval).String())
				return
			}
			if err == nil {
				break
			}
			if sleep(ctx, time.Second); ctx.Err() != nil {
				return
			}
		}
		url, where = g.cfg.DatabaseURL, "database_url"
	}
	n := notifier.New(notifier.Config{DatabaseURL: url, Logger: g.log})
	recheck := make(chan struct{}, 1)
	// After a reconnect, notifications were lost meanwhile: the dispatcher looks, waiters re-read, and the
	// self-check runs again.
	n.Subscribe(notifier.TopicOutbox, func(m notifier.Notification) {
		// A notification names the types of the rows it announces: only those are claimed, since a claim of
		// a type with nothing due is a statement for nothing.
		if m.Resync || m.Payload == "" {
			g.dispatcher.Wake()
		} else {
			for typ := range strings.SplitSeq(m.Payload, ",") {
				g.dispatcher.WakeType(typ)
			}
		}
		if m.Resync {
			select {
			case recheck <- struct{}{}:
			default:
			}
		}
	})
	n.Subscribe(notifier.TopicEffectDone, g.waiters.notified)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { n.Run(ctx) })
	first := true
	for {
		cctx, cancel := context.WithTimeout(ctx, selfCheckTimeout)
		err := n.Check(cctx, g.pool)
		cancel()
		if ctx.Err() != nil {
			return
		}
		g.checked(err, where, first)
		first = false
		t := time.NewTimer(selfCheckEvery)
		select {
		case <-ctx.Done():
		case <-recheck:
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			return
		}
	}
}

// checked records the outcome of a notification self-check, and says so when it changes.
func (g *Gateway) checked(err error, where string, first bool) {
	was := g.heard.Swap(err == nil)
	if err == nil {
		g.metrics.notificationChecks.WithLabelValues("ok").Inc()
		g.metrics.notificationsWorking.Set(1)
		if !was {
			g.log.Info("notifications work: the self-check's notification arrived", "listening_on", where)
		}
		return
	}
	g.metrics.notificationChecks.WithLabelValues("lost").Inc()
	g.metrics.notificationsWorking.Set(0)
	if was || first {
		g.log.Warn("notification self-check failed (err says why): notifications are off until it passes, and "+
			"the gateway polls instead; when the database answers but the notification never arrives, "+where+
			" must be a direct or session-mode connection (never transaction pooling)",
			"listening_on", where, "poll_interval", time.Duration(g.cfg.Dispatcher.FallbackPollInterval).String(), "err", err)
	}
}

// poll is what stands in for notifications: every poll interval, the effects that requests wait for are
// read in one statement and the terminal ones' waiters woken; while notifications are off the interval is
// dispatcher.fallback_poll_interval, and the dispatcher is woken too (it polls at poll_interval itself).
// With notifications on, it covers the ones lost to a gateway that died before sending them.
func (g *Gateway) poll(ctx context.Context) {
	for {
		heard := g.heard.Load()
		interval := time.Duration(g.cfg.Dispatcher.PollInterval)
		if !heard {
			interval = time.Duration(g.cfg.Dispatcher.FallbackPollInterval)
		}
		if sleep(ctx, interval); ctx.Err() != nil {
			return
		}
		if !heard {
			g.dispatcher.Wake()
		}
		ids := g.waiters.ids()
		if len(ids) == 0 {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, time.Duration(g.cfg.Timeouts.Database))
		done, err := g.store.Terminal(qctx, ids)
		cancel()
		if err != nil {
			g.log.Debug("polling the effects that requests wait for failed", "err", err)
			continue
		}
		for _, id := range done {
			g.waiters.wake(id)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
