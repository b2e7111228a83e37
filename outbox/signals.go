package outbox

// testSignals let tests wait for the dispatcher's internal events instead of sleeping, as River's
// TestSignals do. Outside tests they are never initialised, and signalling one costs a nil check.
type testSignals struct {
	claimRound testSignal[struct{}] // a claim round ended
	purgeBatch testSignal[int64]    // a purge batch deleted this many effects
	purgeHeld  testSignal[struct{}] // a purge batch waits on purgeHold
	// purgeHold, when a test sets it, holds every purge batch until it is closed or Purge's context ends:
	// a purge as long as the test wants.
	purgeHold chan struct{}
}

func (s *testSignals) init() {
	s.claimRound.init()
	s.purgeBatch.init()
	s.purgeHeld.init()
}

// testSignal is a buffered channel that events are dropped into without blocking.
type testSignal[T any] struct{ ch chan T }

func (s *testSignal[T]) init() { s.ch = make(chan T, 1000) }

func (s *testSignal[T]) signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}
