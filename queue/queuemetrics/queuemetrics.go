// Package queuemetrics holds the Prometheus collectors of a queue worker process: what its hooks count (handler
// runs, their duration, what its sweeps found) and the queue's state, read on each scrape. They are built
// per registry and passed in, never package globals, so that two workers in one process, or two tests, never
// share a counter, and so that a program that serves no worker does not link the queue to get its own metrics.
//
// The names are oncegate_*, as the gateway's are, so dashboards read both the same way.
package queuemetrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncegate/oncegate/queue"
)

// Metrics are the collectors a worker's hooks count into.
type Metrics struct {
	jobs        *prometheus.CounterVec
	jobDuration *prometheus.HistogramVec
	stalls      *prometheus.CounterVec
	stalledDead *prometheus.CounterVec
	workersLost *prometheus.CounterVec
}

// New builds the collectors and registers them with reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_jobs_total", Help: "Handler runs by queue, job kind and outcome (completed, retry, dead, lease_lost, stopped, error).",
		}, []string{"queue", "kind", "outcome"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "oncegate_job_duration_seconds", Help: "Handler run time.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"queue", "kind"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_stalls_total", Help: "Jobs reclaimed from lost workers or expired leases by this process's sweeps.",
		}, []string{"queue"}),
		stalledDead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_stalled_dead_total", Help: "Jobs that stalled past their max stalls, found by this process's sweeps.",
		}, []string{"queue"}),
		workersLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_workers_lost_total", Help: "Worker processes found dead by this process's sweeps.",
		}, []string{"queue"}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.jobs, m.jobDuration, m.stalls, m.stalledDead, m.workersLost} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// Hooks returns queue.WorkerConfig's OnJobDone and OnSweep, counting into m under the queue's name.
func (m *Metrics) Hooks(queueName string) (onJobDone func(*queue.Job, string, time.Duration), onSweep func(queue.SweepResult)) {
	return func(j *queue.Job, outcome string, took time.Duration) {
			m.jobs.WithLabelValues(queueName, j.Kind, outcome).Inc()
			m.jobDuration.WithLabelValues(queueName, j.Kind).Observe(took.Seconds())
		}, func(r queue.SweepResult) {
			m.stalls.WithLabelValues(queueName).Add(float64(r.Reclaimed))
			m.stalledDead.WithLabelValues(queueName).Add(float64(r.Dead))
			m.workersLost.WithLabelValues(queueName).Add(float64(r.WorkersLost))
		}
}

// QueueCollector reads a queue's depth per state, its oldest ready job's age and its live workers on scrape.
// A scrape that cannot read them within 2 s reports none of them.
type QueueCollector struct{ Queue *queue.Queue }

var (
	queueJobs    = prometheus.NewDesc("oncegate_queue_jobs", "Jobs in the queue by state (dead: the dead letters).", []string{"queue", "state"}, nil)
	queueOldest  = prometheus.NewDesc("oncegate_queue_oldest_ready_seconds", "How long the oldest ready job has waited.", []string{"queue"}, nil)
	queueWorkers = prometheus.NewDesc("oncegate_queue_workers", "Worker processes alive on the queue.", []string{"queue"}, nil)
)

func (QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueJobs
	ch <- queueOldest
	ch <- queueWorkers
}

func (c QueueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := c.Queue.Stats(ctx)
	if err != nil {
		return
	}
	name := c.Queue.Name()
	for _, st := range queue.JobStates() {
		ch <- prometheus.MustNewConstMetric(queueJobs, prometheus.GaugeValue, float64(s.Counts[st]), name, string(st))
	}
	ch <- prometheus.MustNewConstMetric(queueOldest, prometheus.GaugeValue, s.OldestReady.Seconds(), name)
	ch <- prometheus.MustNewConstMetric(queueWorkers, prometheus.GaugeValue, float64(s.Workers), name)
}
