// Package metrics holds the Prometheus collectors of the gateway and its dispatcher, all named oncegate_*,
// so that each part records into the same names and /metrics serves them from one registry.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

var (
	EffectsCreated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_effects_created_total", Help: "Effects accepted under a new idempotency key.",
	}, []string{"type"})
	Replays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_replays_total", Help: "Requests answered with a stored effect (same key, same request).",
	}, []string{"type"})
	KeyReuses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_key_reuses_total", Help: "Requests refused with 422: the key was used for another request.",
	}, []string{"type"})
	Attempts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_delivery_attempts_total", Help: "Delivery attempts by effect type and outcome.",
	}, []string{"type", "outcome"})
	Finished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_effects_finished_total", Help: "Effects that reached a terminal status.",
	}, []string{"type", "status"})
	DispatchLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "oncegate_dispatch_duration_seconds", Help: "Time of one delivery attempt, provider call included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
	}, []string{"type"})
	BreakerState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "oncegate_breaker_state", Help: "Circuit breaker per effect type: 0 closed, 1 half-open, 2 open.",
	}, []string{"type"})
	Rescued = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "oncegate_rescued_total", Help: "Outbox rows claimed again after their dispatcher's lease expired.",
	}, []string{"type"})
)

// NewRegistry returns a registry with every oncegate collector, Go runtime and process metrics, and extra.
func NewRegistry(extra ...prometheus.Collector) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(EffectsCreated, Replays, KeyReuses, Attempts, Finished, DispatchLatency, BreakerState, Rescued,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.MustRegister(extra...)
	return r
}
