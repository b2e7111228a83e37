package queuemetrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
	"github.com/oncegate/oncegate/queue/queuemetrics"
)

// A worker wired to its own registry counts its runs there, and the queue collector reads the queue's state
// on scrape. Other tests run workers at the same time: exact counts show that nothing is shared.
func TestWorkerCountsIntoItsOwnRegistry(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	q, err := queue.New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Destroy(context.Background()) })
	reg := prometheus.NewRegistry()
	m, err := queuemetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(queuemetrics.QueueCollector{Queue: q})
	onDone, onSweep := m.Hooks(q.Name())
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, j *queue.Job) error {
		if j.ID == "bad" {
			return queue.Permanent(errors.New("bad"))
		}
		return nil
	}), &queue.WorkerConfig{OnJobDone: onDone, OnSweep: onSweep})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker run: %v", err)
		}
	})
	for _, id := range []string{"good", "bad"} {
		if _, err := q.Enqueue(context.Background(), queue.NewJob{ID: id, Kind: "signup"}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "both runs counted", func() bool {
		return len(series(t, reg)["oncegate_jobs_total"]) == 2
	})
	got := series(t, reg)
	want := map[string]map[string]float64{
		"oncegate_jobs_total": {
			"kind=signup,outcome=completed,queue=QUEUE": 1,
			"kind=signup,outcome=dead,queue=QUEUE":      1,
		},
		"oncegate_job_duration_seconds": {"kind=signup,queue=QUEUE": 2}, // the sample count
		"oncegate_queue_jobs": {
			"queue=QUEUE,state=ready": 0, "queue=QUEUE,state=delayed": 0, "queue=QUEUE,state=active": 0,
			"queue=QUEUE,state=completed": 1, "queue=QUEUE,state=dead": 1,
		},
		"oncegate_queue_workers": {"queue=QUEUE": 1},
	}
	for name, w := range want {
		if len(got[name]) != len(w) {
			t.Errorf("%s: %v, want %v", name, got[name], w)
		}
		for labels, v := range w {
			labels = strings.ReplaceAll(labels, "QUEUE", q.Name())
			if g, ok := got[name][labels]; !ok || g != v {
				t.Errorf("%s{%s} = %v (present %v), want %v", name, labels, g, ok, v)
			}
		}
	}
}

// series gathers reg into name -> "label=value,…" -> value (a counter's or gauge's value, a histogram's count).
func series(t *testing.T, reg *prometheus.Registry) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		out[mf.GetName()] = map[string]float64{}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			out[mf.GetName()][strings.Join(labels, ",")] = v
		}
	}
	return out
}

// Registering a second set of worker collectors on one registry is refused rather than counted twice.
func TestNewRefusesARegistryThatHasThem(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := queuemetrics.New(reg); err != nil {
		t.Fatal(err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := queuemetrics.New(reg); !errors.As(err, &are) {
		t.Fatalf("second New on one registry: %v, want AlreadyRegisteredError", err)
	}
}
