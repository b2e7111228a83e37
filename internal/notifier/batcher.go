package notifier

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// sendTimeout bounds one NOTIFY of a Batcher, which also runs after its Run's context has ended.
const sendTimeout = 5 * time.Second

// Batcher sends the notifications of one topic for many callers, outside their transactions: the items added
// while a NOTIFY is sent go out together in the next one, deduplicated, and there is at most one NOTIFY every
// interval. A NOTIFY inside each caller's transaction would take Postgres's cluster-wide notification lock at
// every commit, and so serialise the commits. An item lost to a crash between a caller's commit and the send
// costs a poll interval, never correctness: every listener also polls.
type Batcher struct {
	db       Execer
	topic    Topic
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	pending []string
	queued  map[string]bool
	ring    chan struct{}
}

// NewBatcher returns a batcher sending on topic through db at most once every interval; Run sends.
func NewBatcher(db Execer, topic Topic, interval time.Duration, log *slog.Logger) *Batcher {
	if log == nil {
		log = slog.Default()
	}
	return &Batcher{db: db, topic: topic, interval: interval, log: log.With("component", "notifier"),
		queued: map[string]bool{}, ring: make(chan struct{}, 1)}
}

// Add queues item for the next notification. It never blocks.
func (b *Batcher) Add(item string) {
	b.mu.Lock()
	if !b.queued[item] {
		b.queued[item] = true
		b.pending = append(b.pending, item)
	}
	b.mu.Unlock()
	select {
	case b.ring <- struct{}{}:
	default:
	}
}

// Run sends until ctx ends, then sends what is still queued, once.
func (b *Batcher) Run(ctx context.Context) {
	for {
		select {
		case <-b.ring:
		case <-ctx.Done():
			b.flush() // what was added during the last send, or since
			return
		}
		b.flush()
		t := time.NewTimer(b.interval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (b *Batcher) flush() {
	b.mu.Lock()
	items := b.pending
	b.pending = nil
	clear(b.queued)
	b.mu.Unlock()
	for _, payload := range join(items) {
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		if err := Send(ctx, b.db, b.topic, payload); err != nil {
			b.log.Warn("sending a notification failed; its listeners will find the change by polling",
				"topic", string(b.topic), "err", err)
		}
		cancel()
	}
}
