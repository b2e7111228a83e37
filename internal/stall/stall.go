// Package stall tells the time a process stood still (stopped by SIGSTOP, its VM paused, its threads starved
// of a core) from the time its work took, so that a deadline which passed while the process could not run
// is not charged to the work.
//
// The guarantee it keeps: a call given a timeout by WithTimeout ends with context.DeadlineExceeded only once
// it has had that long while the process ran. A gateway stopped for 3 s in the middle of a webhook whose
// receiver answered at once had the answer waiting in its socket when it resumed, and its 2 s timeout, due
// during the stop, fired first: the webhook counted as timed out, was sent again (or, at most once, was
// finished unknown), and the timeouts opened the destination's breaker (issue 31, an outside test).
//
// A stall is seen by a ticker: a tick later than its interval by more than Threshold marks the time between
// as stalled. A timeout that fires checks the time since the last tick too, so that a stall is counted at
// the instant the process resumes, before the ticker has run.
package stall

import (
	"context"
	"sync"
	"time"
)

const (
	// tick is how often the detector looks at the clock.
	tick = 50 * time.Millisecond
	// Threshold is how late a tick must be to count as a stall: scheduling on a busy machine delays ticks
	// by milliseconds, not by a quarter of a second.
	Threshold = 250 * time.Millisecond
	// keep bounds the stalls remembered: a timeout asks only about the time since its call started.
	keep = 256
)

type span struct{ from, to time.Time }

// Detector records the stalls of the process while some timeout of its runs: its ticker runs only then, so
// that an idle process (and a test binary after its tests) keeps no goroutine for it.
type Detector struct {
	mu     sync.Mutex
	last   time.Time // the last tick
	stalls []span    // oldest first, at most keep
	active int       // timeouts running
	stop   chan struct{}
}

var std Detector

// Default returns the process's detector.
func Default() *Detector { return &std }

// acquire counts a timeout in, starting the ticker for the first.
func (d *Detector) acquire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active++; d.active == 1 {
		d.last = time.Now()
		d.stop = make(chan struct{})
		go d.run(d.stop)
	}
}

// release counts a timeout out, stopping the ticker after the last.
func (d *Detector) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active--; d.active == 0 {
		close(d.stop)
	}
}

func (d *Detector) run(stop chan struct{}) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			d.observe(time.Now())
		}
	}
}

// observe records a tick at now, and the stall before it when it came late.
func (d *Detector) observe(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gap := now.Sub(d.last); gap > tick+Threshold {
		if len(d.stalls) == keep {
			d.stalls = append(d.stalls[:0], d.stalls[1:]...)
		}
		d.stalls = append(d.stalls, span{from: d.last.Add(tick), to: now})
	}
	d.last = now
}

// StalledSince returns how long the process stood still between since and now, a stall still in progress
// (no tick since it began) included.
func (d *Detector) StalledSince(since, now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var total time.Duration
	add := func(s span) {
		from, to := s.from, s.to
		if since.After(from) {
			from = since
		}
		if now.Before(to) {
			to = now
		}
		if to.After(from) {
			total += to.Sub(from)
		}
	}
	for i := len(d.stalls) - 1; i >= 0 && d.stalls[i].to.After(since); i-- {
		add(d.stalls[i])
	}
	if now.Sub(d.last) > tick+Threshold {
		add(span{from: d.last.Add(tick), to: now})
	}
	return total
}

// WithTimeout is context.WithTimeout for a call that must not be charged for the process's own stalls: its
// context ends with context.DeadlineExceeded once timeout has passed while the process ran, and reports no
// deadline (a fixed one would be passed on to sockets, whose deadlines a stall runs out as well). It ends at
// once when parent does, with parent's error.
func (d *Detector) WithTimeout(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	c := &timeoutCtx{Context: parent, done: make(chan struct{}), release: d.release}
	d.acquire()
	start := time.Now()
	c.mu.Lock()
	c.timer = time.AfterFunc(timeout, func() {
		now := time.Now()
		ran := now.Sub(start) - d.StalledSince(start, now)
		if ran >= timeout {
			c.end(context.DeadlineExceeded)
			return
		}
		c.mu.Lock()
		if c.err == nil {
			c.timer.Reset(timeout - ran)
		}
		c.mu.Unlock()
	})
	c.mu.Unlock()
	stopParent := context.AfterFunc(parent, func() { c.end(parent.Err()) })
	return c, func() {
		stopParent()
		c.end(context.Canceled)
	}
}

// timeoutCtx is WithTimeout's context.
type timeoutCtx struct {
	context.Context // the parent: its values
	done            chan struct{}

	release func() // the detector's count of timeouts

	mu    sync.Mutex
	err   error
	timer *time.Timer
}

func (c *timeoutCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *timeoutCtx) Done() <-chan struct{}       { return c.done }

func (c *timeoutCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *timeoutCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	c.timer.Stop()
	close(c.done)
	c.release()
}
