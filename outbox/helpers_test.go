package outbox

import (
	"time"

	"github.com/oncegate/oncegate/internal/backoff"
)

func backoffPolicy(d time.Duration) backoff.Policy { return backoff.Policy{Base: d, Max: d} }
