package gateway

// What a failover of the database would cost: the gateway answers 2xx once Postgres has committed an effect,
// and a commit is on a standby by then only if the primary waits for one (synchronous replication). With
// asynchronous standbys only, a failover loses what they had not received when the primary died: effects the
// gateway acknowledged (an outside test lost 0-16 of 3,500 per failover, and none with a synchronous
// standby). The gateway cannot close that itself; it says so, at start, on /readyz and in its metrics.

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

//go:embed replication.sql
var replicationSQL string

// ReplicationState sums up whether an effect the gateway acknowledged survives a failover of its database.
type ReplicationState string

const (
	// ReplicationSync: at least one standby confirms every commit before it is acknowledged (sync_state sync
	// or quorum, with synchronous_commit on, remote_write or remote_apply). Promoting one of those loses none.
	ReplicationSync ReplicationState = "sync"
	// ReplicationAsync: standbys stream from the primary, but no commit waits for one; a failover to any of
	// them may lose the last acknowledged effects.
	ReplicationAsync ReplicationState = "async"
	// ReplicationNone: no streaming standby is seen; a failover would be to a copy made some other way
	// (backups, storage replication), which may lack what was acknowledged last.
	ReplicationNone ReplicationState = "none"
	// ReplicationUnknown: the gateway's database user may not read its standbys' state (grant pg_monitor).
	ReplicationUnknown ReplicationState = "unknown"
	// ReplicationBlocked: commits wait for a synchronous standby (synchronous_standby_names is set) and none
	// is connected, so every write waits until one is, and is answered 503 at timeouts.database.
	ReplicationBlocked ReplicationState = "blocked"
)

// standbyStates are pg_stat_replication's sync_state values, and unknown for a row the user may not read.
var standbyStates = []string{"async", "potential", "quorum", "sync", "unknown"}

// Replication is what /readyz reports of the database's replication.
type Replication struct {
	State ReplicationState `json:"state"`
	// Standbys counts the physical standbys by sync_state (async, potential, quorum, sync, unknown).
	Standbys                map[string]int `json:"standbys"`
	SynchronousCommit       string         `json:"synchronous_commit"`
	SynchronousStandbyNames string         `json:"synchronous_standby_names"`
	// Detail says, in words, what a failover would lose and what closes it.
	Detail string `json:"detail"`
}

// replication reads the replication of the server the gateway's pool writes to.
func (g *Gateway) replication(ctx context.Context) (Replication, error) {
	var r Replication
	var standbys string
	if err := g.pool.QueryRow(ctx, replicationSQL).Scan(&r.SynchronousCommit, &r.SynchronousStandbyNames,
		&standbys); err != nil {
		return r, fmt.Errorf("reading the database's replication: %w", err)
	}
	if err := json.Unmarshal([]byte(standbys), &r.Standbys); err != nil {
		return r, fmt.Errorf("reading the database's replication: %w", err)
	}
	r.State, r.Detail = judgeReplication(r)
	return r, nil
}

// waitsForStandby reports whether the database makes commits wait for a synchronous standby.
func waitsForStandby(r Replication) bool {
	switch r.SynchronousCommit {
	case "on", "remote_write", "remote_apply":
		return r.SynchronousStandbyNames != ""
	}
	return false
}

// judgeReplication says what a failover would lose with r's standbys and settings, and what closes it.
func judgeReplication(r Replication) (ReplicationState, string) {
	const fix = "set synchronous_standby_names on the primary (e.g. 'ANY 1 (standby1, standby2)' or '*') with " +
		"synchronous_commit = on, and let the failover tool promote only a synchronous standby"
	waits := r.SynchronousCommit == "on" || r.SynchronousCommit == "remote_write" || r.SynchronousCommit == "remote_apply"
	total := 0
	for _, n := range r.Standbys {
		total += n
	}
	switch {
	case r.SynchronousStandbyNames != "" && waits && r.Standbys["sync"]+r.Standbys["quorum"] == 0 &&
		r.Standbys["unknown"] == 0:
		return ReplicationBlocked, fmt.Sprintf("synchronous_standby_names is %q but no synchronous standby is "+
			"connected: every commit waits until one is, so writes stop and are answered 503 (retry with the same "+
			"Idempotency-Key); connect a standby that the setting names, or change the setting", r.SynchronousStandbyNames)
	case r.Standbys["sync"]+r.Standbys["quorum"] > 0 && waits:
		return ReplicationSync, "every effect acknowledged is on a synchronous standby first: a failover to one " +
			"(sync_state sync or quorum) loses none; promoting an asynchronous or potential one could"
	case r.Standbys["sync"]+r.Standbys["quorum"] > 0:
		return ReplicationAsync, fmt.Sprintf("synchronous_commit = %s: commits do not wait for the synchronous "+
			"standby, so a failover may lose effects the gateway acknowledged last; set synchronous_commit = on",
			r.SynchronousCommit)
	case r.Standbys["unknown"] > 0:
		return ReplicationUnknown, "the database user may not read pg_stat_replication's sync_state, so whether a " +
			"failover loses acknowledged effects is unknown: grant it pg_monitor to have it checked"
	case total > 0:
		return ReplicationAsync, "the standbys are asynchronous: a failover loses the effects the gateway " +
			"acknowledged that the promoted standby had not yet received; to lose none, " + fix
	default:
		return ReplicationNone, "no streaming standby of this server is seen: a failover would be to a copy made " +
			"otherwise (backups, storage replication), which may lack effects acknowledged last; with streaming " +
			"standbys, " + fix
	}
}

// replicationEvery is how often the gateway reads its database's replication again, to say when it changed:
// after a failover, the new primary has standbys of its own, or none yet.
const replicationEvery = 10 * time.Second

// logReplication says what a failover of the database would lose: a warning unless nothing. It says it at
// start, and after that whenever it changed (watchReplication). A database that does not answer is the
// other checks' business.
func (g *Gateway) logReplication(ctx context.Context, start bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(g.cfg.Timeouts.Ready))
	defer cancel()
	r, err := g.replication(ctx)
	if err != nil {
		if start {
			g.log.Warn("could not check the database's replication at start-up", "err", err)
		}
		return
	}
	// Replays wait for the standby while commits do (createEffect): an earlier request's commit may be on the
	// primary alone.
	g.syncReplication.Store(waitsForStandby(r))
	if was := g.replicationSeen.Swap(string(r.State)); !start && was == string(r.State) {
		return
	}
	level := slog.LevelWarn
	if r.State == ReplicationSync {
		level = slog.LevelInfo
	}
	msg := map[ReplicationState]string{
		ReplicationSync:    "the database has a synchronous standby: acknowledged effects survive a failover to it",
		ReplicationAsync:   "the database's standbys are asynchronous: a failover may lose acknowledged effects",
		ReplicationNone:    "the database has no streaming standby: a failover may lose acknowledged effects",
		ReplicationUnknown: "cannot tell whether a failover of the database loses acknowledged effects",
		ReplicationBlocked: "commits wait for a synchronous standby and none is connected: writes are stopped",
	}[r.State]
	g.log.Log(ctx, level, msg, "replication", r.State, "standbys", r.Standbys, "synchronous_commit",
		r.SynchronousCommit, "synchronous_standby_names", r.SynchronousStandbyNames, "detail", r.Detail)
}

// watchReplication reads the database's replication every replicationEvery until ctx ends, and says so when
// it changed.
func (g *Gateway) watchReplication(ctx context.Context) {
	for {
		if sleep(ctx, replicationEvery); ctx.Err() != nil {
			return
		}
		g.logReplication(ctx, false)
	}
}

// replicationCollector reads the database's standbys when /metrics is scraped.
type replicationCollector struct {
	g       *Gateway
	timeout time.Duration
}

var dbStandbys = prometheus.NewDesc("oncegate_db_standbys",
	"Physical standbys of the database the gateway writes to, by pg_stat_replication's sync_state: with none "+
		"sync or quorum, a failover may lose effects the gateway acknowledged. unknown: the database user may "+
		"not read sync_state (grant pg_monitor).", []string{"sync_state"}, nil)

func (replicationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- dbStandbys }

func (c replicationCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	r, err := c.g.replication(ctx)
	if err != nil {
		return // no series rather than a claim of no standbys
	}
	for _, s := range standbyStates {
		ch <- prometheus.MustNewConstMetric(dbStandbys, prometheus.GaugeValue, float64(r.Standbys[s]), s)
	}
}
