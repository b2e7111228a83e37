// Package workers runs functions each on a goroutine of its own, as the go statement does, but hands a
// function to a goroutine that has just finished another when one is waiting, instead of starting one.
//
// A delivery runs deep: a provider, an HTTP client, pgx. A new goroutine's stack grows to that depth by
// copying itself, twice or more, for every delivery: a sixteenth of a gateway's CPU for a webhook (issue 14).
// A goroutine that stays grows once. What it keeps is bounded by how many run at once, and a goroutine that
// waits for longer than the idle time, or is told to stop, ends.
package workers

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pool runs functions on goroutines that wait, for a while after each, for the next.
type Pool struct {
	idleFor  time.Duration
	tasks    chan func() // unbuffered: a send succeeds only when a waiting goroutine takes the function
	quit     chan struct{}
	stop     sync.Once
	busy     sync.WaitGroup // functions given and not returned
	alive    sync.WaitGroup // the pool's goroutines
	waitingN atomic.Int32   // goroutines waiting for a function, for tests
}

// New returns a pool whose goroutines end after waiting idle for a function.
func New(idle time.Duration) *Pool {
	return &Pool{idleFor: idle, tasks: make(chan func()), quit: make(chan struct{})}
}

// Go runs fn on a goroutine: one that waits for work, or a new one. It never waits for a goroutine to be free.
func (p *Pool) Go(fn func()) {
	p.busy.Add(1)
	select {
	case p.tasks <- fn:
	default:
		p.alive.Go(func() { p.work(fn) })
	}
}

func (p *Pool) work(fn func()) {
	idle := time.NewTimer(p.idleFor)
	defer idle.Stop()
	for {
		p.run(fn)
		fn = nil // what it holds (a delivery's payload) is garbage now, not kept while the goroutine waits
		idle.Reset(p.idleFor)
		p.waitingN.Add(1)
		select {
		case fn = <-p.tasks:
			p.waitingN.Add(-1)
		case <-idle.C:
			p.waitingN.Add(-1)
			return
		case <-p.quit:
			p.waitingN.Add(-1)
			return
		}
	}
}

func (p *Pool) run(fn func()) {
	defer p.busy.Done()
	fn()
}

// waiting counts the goroutines waiting for a function.
func (p *Pool) waiting() int { return int(p.waitingN.Load()) }

// Wait waits for every function given to Go to return. As with a sync.WaitGroup, a call to Go that starts
// while Wait waits for none must not race with it.
func (p *Pool) Wait() { p.busy.Wait() }

// Close ends the goroutines that wait for work, once they have finished what they run, and waits for them.
// Go must not be called after Close.
func (p *Pool) Close() {
	p.stop.Do(func() { close(p.quit) })
	p.alive.Wait()
}
