package outbox

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/notifier"
)

// notifyInterval is the least time between two notifications of finished effects from one dispatcher.
const notifyInterval = 5 * time.Millisecond

// newDoneBatcher tells the other gateways which effects this one finished (notifier.TopicEffectDone), so that
// requests waiting there answer at once: one notification for all that finished while the previous one was
// sent, at most every 5 ms. A NOTIFY inside each Finish would serialise their commits on Postgres's
// notification queue lock; batching here keeps them apart.
func newDoneBatcher(pool *pgxpool.Pool, log *slog.Logger) *notifier.Batcher {
	return notifier.NewBatcher(pool, notifier.TopicEffectDone, notifyInterval, log)
}
