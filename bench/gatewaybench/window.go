package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The crash window: a gateway killed after a destination accepted an effect and before the commit that
// records it resends that effect (smtp, webhook, http, under at_least_once). Its width is what the gateway
// measures in oncegate_outcome_record_seconds{type, provider}, from the destination's acceptance to that
// commit. windowPhase measures it under load: one gateway accepts a stream of effects, half of them
// analytics rows (the accepts and records that compete with the outcomes for the database) and the rest
// emails, webhooks and upstream calls to local servers, and delivers them all, for -duration.

// windowBodies are the effects the window phase posts, in turn.
var windowBodies = []string{
	`{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`,
	`{"type":"hook","payload":{"event":"order.paid","data":{"order":42,"total":"19.99"}}}`,
	`{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`,
	`{"type":"up","payload":{"method":"POST","path":"/v1/charges","body":"amount=2000&currency=usd"}}`,
	`{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`,
	`{"type":"mail","payload":{"to":["user@example.test"],"subject":"Welcome","text":"Hello."}}`,
}

// windowProviders are the providers whose window the phase reports, with their effect types.
var windowProviders = []struct{ kind, typ string }{{"smtp", "mail"}, {"webhook", "hook"}, {"http", "up"}}

// windowPhase runs the phase with c clients and prints its table row and the window line.
func windowPhase(ctx context.Context, cfg string, conn *pgx.Conn, c int) {
	g := startGateway(cfg)
	defer g.stop()
	cpu0 := sampleCPU(g.pid)
	var mu sync.Mutex
	var sent int
	var wg sync.WaitGroup
	stop := time.Now().Add(*duration)
	start := time.Now()
	for n := range c {
		wg.Go(func() {
			client := newRawClient(g.url)
			defer client.close()
			i := n
			for ; time.Now().Before(stop); i++ {
				do(client, fmt.Sprintf("w%d-%d", n, i), windowBodies[i%len(windowBodies)], 202)
			}
			mu.Lock()
			sent += i - n
			mu.Unlock()
		})
	}
	wg.Wait()
	for {
		var drained bool
		must(conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM oncegate_outbox
			WHERE type = ANY ('{analytics,hook,up,mail}') AND run_at < now() + interval '1 hour')`).Scan(&drained))
		if drained {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rate := float64(sent) / time.Since(start).Seconds()
	cpu := perRequest(cpu0, sampleCPU(g.pid), float64(sent))
	hist := scrapeHistograms(g.url, "oncegate_outcome_record_seconds")
	handoff := scrapeHistograms(g.url, "oncegate_outcome_handoff_seconds")
	fmt.Println(tableHeader)
	fmt.Printf("| accepts and deliveries together (half analytics, the rest smtp, webhook, http) | %d | %.0f | | | | | | %.0f MiB | %s |\n",
		c, rate, g.maxRSS(), cpu)
	var cells []string
	var line []string
	for _, p := range windowProviders {
		h := hist[p.typ+"/"+p.kind]
		cells = append(cells, fmt.Sprintf("%s: %d recorded, p50 %.2f ms, p99 %.2f ms, max ≤ %.2f ms", p.kind, int(h.count),
			h.quantile(0.5)*1000, h.quantile(0.99)*1000, h.max()*1000))
		line = append(line, fmt.Sprintf("%s p99 %.2f ms", p.kind, h.quantile(0.99)*1000))
	}
	var handed []string
	for _, p := range windowProviders {
		h := handoff[p.typ+"/"+p.kind]
		handed = append(handed, fmt.Sprintf("%s p50 %.3f ms, p99 %.3f ms, max ≤ %.3f ms", p.kind, h.quantile(0.5)*1000,
			h.quantile(0.99)*1000, h.max()*1000))
	}
	fmt.Printf("\nwindow, %d clients, acceptance to recorded commit (oncegate_outcome_record_seconds): %s\n", c,
		strings.Join(cells, "; "))
	fmt.Printf("what a SIGKILL can land in, acceptance to the statement written (oncegate_outcome_handoff_seconds): %s\n",
		strings.Join(handed, "; "))
	fmt.Printf("window: %s (acceptance to recorded commit)\n", strings.Join(line, ", "))
}

// histogram is one series of a Prometheus histogram: its buckets' upper bounds and cumulative counts.
type histogram struct {
	les    []float64
	counts []float64
	count  float64
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile does: linearly within its bucket.
func (h histogram) quantile(q float64) float64 {
	if h.count == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, le := range h.les {
		if h.counts[i] >= rank {
			if math.IsInf(le, 1) {
				return lower
			}
			return lower + (le-lower)*(rank-below)/(h.counts[i]-below)
		}
		lower, below = le, h.counts[i]
	}
	return lower
}

// max is the upper bound of the highest bucket that holds an observation.
func (h histogram) max() float64 {
	for i, le := range h.les {
		if h.counts[i] >= h.count {
			return le
		}
	}
	return math.Inf(1)
}

// scrapeHistograms reads the histogram name from a gateway's /metrics, by "type/provider".
func scrapeHistograms(base, name string) map[string]histogram {
	resp, err := http.Get(base + "/metrics")
	must(err)
	defer resp.Body.Close()
	out := map[string]histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"_bucket{") && !strings.HasPrefix(l, name+"_count{") {
			continue
		}
		open, end := strings.IndexByte(l, '{'), strings.LastIndexByte(l, '}')
		labels := map[string]string{}
		for _, kv := range strings.Split(l[open+1:end], ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(v, `"`)
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(l[end+1:]), 64)
		key := labels["type"] + "/" + labels["provider"]
		h := out[key]
		if strings.HasPrefix(l, name+"_count{") {
			h.count = v
		} else {
			le, _ := strconv.ParseFloat(labels["le"], 64)
			h.les, h.counts = append(h.les, le), append(h.counts, v)
		}
		out[key] = h
	}
	for k, h := range out {
		idx := make([]int, len(h.les))
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(a, b int) bool { return h.les[idx[a]] < h.les[idx[b]] })
		les, counts := make([]float64, len(idx)), make([]float64, len(idx))
		for i, j := range idx {
			les[i], counts[i] = h.les[j], h.counts[j]
		}
		h.les, h.counts = les, counts
		out[k] = h
	}
	return out
}
