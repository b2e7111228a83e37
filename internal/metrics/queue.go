package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/oncegate/oncegate/queue"
)

// Worker-side collectors: what the worker's hooks count, and the queue's state read on each scrape.
var (
	Jobs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_jobs_total", Help: "Handler runs by queue, job kind and outcome (completed, retry, dead, lease_lost, stopped, error).",
	}, []string{"queue", "kind", "outcome"})
	JobDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "oncegate_job_duration_seconds", Help: "Handler run time.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
	}, []string{"queue", "kind"})
	Stalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_stalls_total", Help: "Jobs reclaimed from lost workers or expired leases by this process's sweeps.",
	}, []string{"queue"})
	StalledDead = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_stalled_dead_total", Help: "Jobs that stalled past their max stalls, found by this process's sweeps.",
	}, []string{"queue"})
	WorkersLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_workers_lost_total", Help: "Worker processes found dead by this process's sweeps.",
	}, []string{"queue"})
)

// Hooks returns queue.WorkerConfig hooks that count into the collectors above.
func Hooks(queueName string) (func(*queue.Job, string, time.Duration), func(queue.SweepResult)) {
	return func(j *queue.Job, outcome string, took time.Duration) {
			Jobs.WithLabelValues(queueName, j.Kind, outcome).Inc()
			JobDuration.WithLabelValues(queueName, j.Kind).Observe(took.Seconds())
		}, func(r queue.SweepResult) {
			Stalls.WithLabelValues(queueName).Add(float64(r.Reclaimed))
			StalledDead.WithLabelValues(queueName).Add(float64(r.Dead))
			WorkersLost.WithLabelValues(queueName).Add(float64(r.WorkersLost))
		}
}

// QueueCollector reads a queue's depth per state, its oldest ready job's age and its live workers on scrape.
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

// NewWorkerRegistry returns a registry for a worker process of q.
func NewWorkerRegistry(q *queue.Queue) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(Jobs, JobDuration, Stalls, StalledDead, WorkersLost, QueueCollector{Queue: q},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}
