package gateway

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/outbox"
)

// metrics are one gateway's collectors: its own and its dispatcher's, on a registry of its own, so that
// gateways in one process (tests run many) never share a counter.
type metrics struct {
	registry       *prometheus.Registry
	dispatcher     *outbox.Metrics
	effectsCreated *prometheus.CounterVec
	replays        *prometheus.CounterVec
	keyReuses      *prometheus.CounterVec
	rateLimited    *prometheus.CounterVec
	// proxied counts the dedup proxy's requests by type and what became of them (proxy.go).
	proxied *prometheus.CounterVec
	// notificationsWorking is 1 while the notification self-check passes, 0 while the gateway polls instead.
	notificationsWorking prometheus.Gauge
	notificationChecks   *prometheus.CounterVec
	// held is each tenant's held requests (held.go); heldCut counts the waits and bodies it cut short.
	held    *prometheus.GaugeVec
	heldCut *prometheus.CounterVec
	// connections is the client connections by state, connectionsClosed those the gate closed for room
	// (conngate.go).
	connections       *prometheus.GaugeVec
	connectionsClosed *prometheus.CounterVec
}

func newMetrics(store *dedup.Store, scrapeTimeout time.Duration, pools map[string]*pgxpool.Pool, types []string) *metrics {
	m := &metrics{
		registry:   prometheus.NewRegistry(),
		dispatcher: outbox.NewMetrics(),
		effectsCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_effects_created_total", Help: "Effects accepted under a new idempotency key.",
		}, []string{"type"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_replays_total", Help: "Requests answered with a stored effect (same key, same request).",
		}, []string{"type"}),
		keyReuses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_key_reuses_total", Help: "Requests refused with 422: the key was used for another request.",
		}, []string{"type"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_rate_limited_total", Help: "Requests refused with 429: the tenant was over its rate of requests or of bytes.",
		}, []string{"tenant", "bucket"}),
		proxied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_proxy_requests_total",
			Help: "Requests to the dedup proxy by effect type and result: performed (sent to the upstream and " +
				"recorded), retried (a transient failure, not stored), replayed (a stored answer), passed (a safe " +
				"method, not recorded), in_flight (409), key_reused (422), refused (an invalid request).",
		}, []string{"type", "result"}),
		notificationsWorking: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "oncegate_notifications_working",
			Help: "1 while the notification self-check passes; 0 while notifications are off and the gateway polls instead.",
		}),
		notificationChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_notification_checks_total",
			Help: "Notification self-checks, by result: ok (the notification arrived) or lost.",
		}, []string{"result"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "oncegate_held_requests",
			Help: "Requests of each tenant held open: waiting (wait, a proxied request waiting for another's attempt) or reading a body.",
		}, []string{"tenant"}),
		heldCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_held_cut_total",
			Help: "Held requests cut short, by tenant and what: wait (over the tenant's held_requests, answered at " +
				"once), shed (a wait ended early to free a connection), body (over held_requests, given 1 s to arrive).",
		}, []string{"tenant", "what"}),
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "oncegate_connections",
			Help: "Open client connections by state: new (nothing sent yet), headers (a request arriving), serving, idle.",
		}, []string{"state"}),
		connectionsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oncegate_connections_closed_total",
			Help: "Connections that held no request, closed to make room for new ones, by state: new, headers, idle.",
		}, []string{"state"}),
	}
	for _, state := range []connState{connNew, connHeaders, connServing, connIdle} {
		m.connections.WithLabelValues(state.String())
		if state != connServing { // never closed by the gate
			m.connectionsClosed.WithLabelValues(state.String())
		}
	}
	m.registry.MustRegister(m.held, m.heldCut, m.connections, m.connectionsClosed)
	m.registry.MustRegister(m.effectsCreated, m.replays, m.proxied, m.keyReuses, m.rateLimited, m.notificationsWorking,
		m.notificationChecks, backlogCollector{store: store, timeout: scrapeTimeout, types: types}, groupCommitCollector{store: store},
		poolCollector(pools),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(m.dispatcher.Collectors()...)
	return m
}

// backlogCollector reads the outbox backlog when /metrics is scraped.
type backlogCollector struct {
	store   *dedup.Store
	timeout time.Duration
	// types are the configured effect types: each has its series, 0 while nothing waits, so that an alert
	// on the backlog sees 0 rather than no series (an outside tester's dashboards saw the metric missing).
	types []string
}

var (
	backlogRows = prometheus.NewDesc("oncegate_outbox_backlog", "Outbox rows waiting for delivery.", []string{"type"}, nil)
	backlogAge  = prometheus.NewDesc("oncegate_outbox_oldest_due_seconds",
		"How long the oldest due outbox row has waited.", []string{"type"}, nil)
)

func (backlogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- backlogRows; ch <- backlogAge }

func (b backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	backlogs, err := b.store.Backlogs(ctx)
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, bl := range backlogs {
		seen[bl.Type] = true
		ch <- prometheus.MustNewConstMetric(backlogRows, prometheus.GaugeValue, float64(bl.Rows), bl.Type)
		ch <- prometheus.MustNewConstMetric(backlogAge, prometheus.GaugeValue, bl.OldestDue.Seconds(), bl.Type)
	}
	for _, typ := range b.types {
		if !seen[typ] {
			ch <- prometheus.MustNewConstMetric(backlogRows, prometheus.GaugeValue, 0, typ)
			ch <- prometheus.MustNewConstMetric(backlogAge, prometheus.GaugeValue, 0, typ)
		}
	}
}

// groupCommitCollector reads what group commit has done (dedup.Store.BatchStats) when /metrics is scraped:
// rows over statements is the mean batch, the number an operator tunes group_commit by.
type groupCommitCollector struct{ store *dedup.Store }

var (
	groupStatements = prometheus.NewDesc("oncegate_group_commit_statements_total",
		"Statements that recorded batched writes, by kind: create (new effects) or finish (outcomes).", []string{"kind"}, nil)
	groupRows = prometheus.NewDesc("oncegate_group_commit_rows_total",
		"Writes recorded by those statements, by kind; rows over statements is the mean batch.", []string{"kind"}, nil)
	groupLargest = prometheus.NewDesc("oncegate_group_commit_largest_batch",
		"The largest batch recorded in one statement since the gateway started, by kind.", []string{"kind"}, nil)
	groupSplit = prometheus.NewDesc("oncegate_group_commit_split_total",
		"Batches that Postgres refused whole and that were recorded again one write at a time, by kind.", []string{"kind"}, nil)
)

func (groupCommitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- groupStatements
	ch <- groupRows
	ch <- groupLargest
	ch <- groupSplit
}

func (c groupCommitCollector) Collect(ch chan<- prometheus.Metric) {
	creates, finishes := c.store.BatchStats()
	for kind, s := range map[string]dedup.BatchStats{"create": creates, "finish": finishes} {
		ch <- prometheus.MustNewConstMetric(groupStatements, prometheus.CounterValue, float64(s.Batches), kind)
		ch <- prometheus.MustNewConstMetric(groupRows, prometheus.CounterValue, float64(s.Requests), kind)
		ch <- prometheus.MustNewConstMetric(groupLargest, prometheus.GaugeValue, float64(s.Largest), kind)
		ch <- prometheus.MustNewConstMetric(groupSplit, prometheus.CounterValue, float64(s.Split), kind)
	}
}

// poolCollector reads the gateway's connection pools (pgxpool.Stat) when /metrics is scraped, by pool: "main"
// (requests, claims, the dispatcher's reads and writes) and "outcomes" (the outcomes of calls made outside
// the database, database.go). A request that waits for a connection waits in none of the statements'
// timings: empty acquires and their wait are where a pool too small for the load shows.
type poolCollector map[string]*pgxpool.Pool

var (
	poolConns = prometheus.NewDesc("oncegate_db_pool_connections",
		"Connections of the gateway's pool, by pool (main, outcomes) and state: in_use, idle or opening.", []string{"pool", "state"}, nil)
	poolMax = prometheus.NewDesc("oncegate_db_pool_max_connections",
		"The most connections the pool opens: for main, pool_max_conns less those kept for outcomes and the partition manager's.",
		[]string{"pool"}, nil)
	poolAcquires = prometheus.NewDesc("oncegate_db_pool_acquires_total",
		"Connections taken from the pool, by pool.", []string{"pool"}, nil)
	poolEmptyAcquires = prometheus.NewDesc("oncegate_db_pool_empty_acquires_total",
		"Connections asked of the pool when none was idle: each waited for one to be freed or opened.", []string{"pool"}, nil)
	poolEmptyWait = prometheus.NewDesc("oncegate_db_pool_empty_acquire_wait_seconds_total",
		"Time spent waiting by those asks; over oncegate_db_pool_empty_acquires_total, the mean wait.", []string{"pool"}, nil)
	poolCanceled = prometheus.NewDesc("oncegate_db_pool_canceled_acquires_total",
		"Asks for a connection given up before one came (their context ended).", []string{"pool"}, nil)
)

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolConns, poolMax, poolAcquires, poolEmptyAcquires, poolEmptyWait, poolCanceled} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, p := range c {
		if p == nil {
			continue
		}
		st := p.Stat()
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.AcquiredConns()), name, "in_use")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.IdleConns()), name, "idle")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.ConstructingConns()), name, "opening")
		ch <- prometheus.MustNewConstMetric(poolMax, prometheus.GaugeValue, float64(st.MaxConns()), name)
		ch <- prometheus.MustNewConstMetric(poolAcquires, prometheus.CounterValue, float64(st.AcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolEmptyAcquires, prometheus.CounterValue, float64(st.EmptyAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(poolEmptyWait, prometheus.CounterValue, st.EmptyAcquireWaitTime().Seconds(), name)
		ch <- prometheus.MustNewConstMetric(poolCanceled, prometheus.CounterValue, float64(st.CanceledAcquireCount()), name)
	}
}
