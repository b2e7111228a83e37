package workers

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"
)

// goroutineID identifies the goroutine it runs on, from the first line of its stack ("goroutine N [...").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	for i := len("goroutine "); i < len(buf); i++ {
		if buf[i] == ' ' {
			return string(buf[len("goroutine "):i])
		}
	}
	return string(buf)
}

// One function after another, each given once the one before has returned, runs on one goroutine.
func TestAFinishedGoroutineRunsTheNextFunction(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	ids := map[string]bool{}
	for range 100 {
		ran := make(chan string)
		p.Go(func() { ran <- goroutineID() })
		ids[<-ran] = true
		// Go hands a function only to a goroutine already waiting in its select: let it get there.
		waitFor(t, func() bool { return p.waiting() >= 1 })
	}
	// One, but for the moment between a goroutine counting itself as waiting and its select, when Go starts
	// another: rare, and never often.
	if len(ids) > 3 {
		t.Fatalf("100 functions, one at a time, ran on %d goroutines; want 1", len(ids))
	}
}

// Go never waits for a goroutine to be free: functions that block each other all run at once.
func TestGoNeverWaits(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	const n = 50
	var started sync.WaitGroup
	started.Add(n)
	release := make(chan struct{})
	for range n {
		p.Go(func() {
			started.Done()
			<-release
		})
	}
	done := make(chan struct{})
	go func() { started.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("not every function started while the others blocked")
	}
	close(release)
	p.Wait()
}

// Wait returns once every function has returned, not before.
func TestWaitWaitsForEveryFunction(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	var finished atomic.Int32
	for i := range 20 {
		p.Go(func() {
			time.Sleep(time.Duration(i) * time.Millisecond)
			finished.Add(1)
		})
	}
	p.Wait()
	if got := finished.Load(); got != 20 {
		t.Fatalf("Wait returned with %d of 20 functions finished", got)
	}
}

// A goroutine that waits longer than the idle time ends; Close ends the others, and a function given after the
// idle ones ended still runs.
func TestIdleGoroutinesEnd(t *testing.T) {
	p := New(20 * time.Millisecond)
	for range 10 {
		p.Go(func() { time.Sleep(5 * time.Millisecond) })
	}
	p.Wait()
	waitFor(t, func() bool { return p.waiting() == 0 })
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	<-ran
	p.Close() // the goroutine that ran it is waiting, with a long time to go: Close ends it
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// A goroutine waiting for work does not keep the last function, nor what it holds (a delivery's payload).
func TestAWaitingGoroutineKeepsNothingOfTheLastFunction(t *testing.T) {
	p := New(time.Minute)
	defer p.Close()
	payload := make([]byte, 1<<20)
	ref := weak.Make(&payload[0])
	ran := make(chan struct{})
	p.Go(func() {
		payload[0] = 1
		close(ran)
	})
	<-ran
	waitFor(t, func() bool { return p.waiting() >= 1 })
	payload = nil
	waitFor(t, func() bool {
		runtime.GC()
		return ref.Value() == nil
	})
}
