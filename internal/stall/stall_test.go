package stall

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A stall seen by the ticker is counted between its bounds, and one still in progress (no tick since) too.
func TestStalledSinceCountsStalls(t *testing.T) {
	t0 := time.Now()
	d := &Detector{last: t0}
	d.observe(t0.Add(tick))
	d.observe(t0.Add(tick + 2*time.Second)) // a tick 2 s late: stalled from t0+2tick to t0+tick+2s
	now := t0.Add(2*tick + 2*time.Second)
	if got, want := d.StalledSince(t0, now), 2*time.Second-tick; got != want {
		t.Fatalf("stalled %v, want %v", got, want)
	}
	if got := d.StalledSince(t0.Add(2*time.Second), now); got != tick {
		t.Fatalf("stalled %v since a time within the stall, want %v", got, tick)
	}
	// No tick for a second since the last: a stall in progress.
	last := t0.Add(tick + 2*time.Second)
	if got, want := d.StalledSince(last, last.Add(time.Second)), time.Second-tick; got != want {
		t.Fatalf("stalled %v in progress, want %v", got, want)
	}
	// Late by less than the threshold: not a stall.
	d.observe(last.Add(tick + Threshold/2))
	if got := d.StalledSince(last, last.Add(tick+Threshold/2)); got != 0 {
		t.Fatalf("stalled %v for a tick late by less than the threshold", got)
	}
}

// A timeout in a process that runs ends as context.WithTimeout's does; cancel and the parent end it too.
func TestWithTimeoutEnds(t *testing.T) {
	d := &Detector{}
	ctx, cancel := d.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	<-ctx.Done()
	if took := time.Since(start); took < 100*time.Millisecond || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("ended after %v with %v", took, ctx.Err())
	}
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("reports a deadline")
	}
	ctx, cancel = d.WithTimeout(context.Background(), time.Hour)
	cancel()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("cancelled: %v", ctx.Err())
	}
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel = d.WithTimeout(parent, time.Hour)
	defer cancel()
	stop()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("parent cancelled: %v", ctx.Err())
	}
}

// A timeout does not count a stall that its call lived through: it runs that much longer.
func TestWithTimeoutLeavesOutAStall(t *testing.T) {
	d := &Detector{}
	start := time.Now()
	ctx, cancel := d.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	d.mu.Lock()
	d.stalls = append(d.stalls, span{from: start, to: start.Add(250 * time.Millisecond)}) // as the ticker records one
	d.mu.Unlock()
	<-ctx.Done()
	if took := time.Since(start); took < 550*time.Millisecond || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("ended after %v with %v, want 300 ms of running after a 250 ms stall", took, ctx.Err())
	}
}
