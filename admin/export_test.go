package admin

import (
	"context"
	"time"
)

// EffectsListSQL is the listing's statement, for tests that read its plan.
var EffectsListSQL = effectsListSQL

// SinceID is sinceID, for tests that run the listing's statement themselves.
func (s *Service) SinceID(ctx context.Context, since time.Time) (*int64, error) {
	return s.sinceID(ctx, since)
}
