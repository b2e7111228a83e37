package outbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the dispatcher's collectors, built per dispatcher so that two gateways in one process (tests
// run many) count apart. Register Collectors() on the registry that serves /metrics.
type Metrics struct {
	Attempts        *prometheus.CounterVec   // oncegate_delivery_attempts_total{type, outcome}
	Finished        *prometheus.CounterVec   // oncegate_effects_finished_total{type, status}
	DispatchLatency *prometheus.HistogramVec // oncegate_dispatch_duration_seconds{type}
	BreakerState    *prometheus.GaugeVec     // oncegate_breaker_state{type, tenant, destination}
	BreakersOpen    *prometheus.GaugeVec     // oncegate_breakers_open{type}
	Rescued         *prometheus.CounterVec   // oncegate_rescued_total{type}
	// OutcomeRecord is the crash window: from the destination's acceptance of an effect (SMTP's reply to the
	// end of DATA, a webhook's status line, an upstream's answer) to the commit that records it.
	OutcomeRecord *prometheus.HistogramVec // oncegate_outcome_record_seconds{type, provider}
	// OutcomeHandoff is the part of that window a SIGKILL can land in: from the acceptance to the moment the
	// statement recording it is written to the database, which commits it though the gateway is gone.
	OutcomeHandoff  *prometheus.HistogramVec // oncegate_outcome_handoff_seconds{type, provider}
	LeaseExtensions prometheus.Counter       // oncegate_lease_extensions_total
	// Direct counts the new effects whose outbox row the gateway that created them claimed by its ID, without
	// waiting for the claim loop (expedite.go), by how it went: claimed, taken (another claim had it first),
	// paused (its type or destination is), failed (the claim loop has it).
	Direct *prometheus.CounterVec // oncegate_direct_claims_total{type, result}
	// Probes counts the calls that ended destinations' pauses: one row's call each, before the rest (probe.go).
	Probes *prometheus.CounterVec // oncegate_pause_probes_total{type}
}

// NewMetrics returns a new set of the dispatcher's collectors.
func NewMetrics() *Metrics {
	return &Metrics{
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_delivery_attempts_total", Help: "Delivery attempts by effect type and outcome.",
		}, []string{"type", "outcome"}),
		Finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_effects_finished_total", Help: "Effects that reached a terminal status.",
		}, []string{"type", "status"}),
		DispatchLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "oncegate_dispatch_duration_seconds", Help: "Time of one delivery attempt, provider call included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"type"}),
		// One series per breaker kept, and breakers are bounded (Config.MaxBreakers per type and tenant) and
		// forgotten when idle, with their series: a tenant naming a million hosts makes at most MaxBreakers+1
		// series, and only while it uses them.
		BreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "oncegate_breaker_state",
			Help: "Circuit breaker per effect type, tenant and destination host: 0 closed, 1 half-open, 2 open.",
		}, []string{"type", "tenant", "destination"}),
		BreakersOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "oncegate_breakers_open", Help: "Circuit breakers of an effect type that are open or half-open.",
		}, []string{"type"}),
		Rescued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_rescued_total", Help: "Outbox rows claimed again after their dispatcher's lease expired.",
		}, []string{"type"}),
		OutcomeRecord: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "oncegate_outcome_record_seconds",
			Help: "Time from a destination's acceptance of an effect to the commit that records it: the window " +
				"in which a gateway killed resends.",
			Buckets: prometheus.ExponentialBucketsRange(0.0001, 30, 60), // fine enough (×1.24) for a p99 to read
		}, []string{"type", "provider"}),
		OutcomeHandoff: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "oncegate_outcome_handoff_seconds",
			Help: "Time from a destination's acceptance of an effect to the moment the statement that records it " +
				"is written to the database: the part of the crash window that a gateway killed resends in " +
				"(Postgres commits a statement it has read, though its client is gone).",
			Buckets: prometheus.ExponentialBucketsRange(0.00001, 30, 70),
		}, []string{"type", "provider"}),
		LeaseExtensions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oncegate_lease_extensions_total",
			Help: "Leases extended by a dispatcher holding an outcome it could not record yet, or a long provider call.",
		}),
		Direct: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_direct_claims_total",
			Help: "New effects claimed by the gateway that created them, by ID, without waiting for the claim loop: " +
				"claimed, taken (another claim had the row first), paused (its type or destination is), " +
				"failed (left to the claim loop).",
		}, []string{"type", "result"}),
		Probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_pause_probes_total",
			Help: "Probes of paused destinations: one row's call that asks, once a pause has run out, whether the " +
				"destination is ready before the rows that waited for it go.",
		}, []string{"type"}),
	}
}

// Collectors lists the collectors, for prometheus.Registerer.MustRegister.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Attempts, m.Finished, m.DispatchLatency, m.BreakerState, m.BreakersOpen,
		m.Rescued, m.OutcomeRecord, m.OutcomeHandoff, m.LeaseExtensions, m.Direct, m.Probes}
}
