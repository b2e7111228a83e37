package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// ChaosConfig sizes a chaos run.
type ChaosConfig struct {
	Jobs      int           // jobs in all, a third of each kind
	KillEvery time.Duration // mean time between kills
	Workers   int           // worker processes (default 3)
	Gateways  int           // gateway processes (default 2); workers spread over them
	// Spare keeps gateway-0 and worker-0 alive through the run, so a soak can watch their memory.
	Spare bool
}

// ChaosRow is one effect type's outcome.
type ChaosRow struct {
	Type       string `json:"type"`
	Jobs       int    `json:"jobs"`
	Delivered  int    `json:"delivered"`
	Lost       int    `json:"lost"`
	Duplicated int    `json:"duplicated"`
	// How the destination tells one effect from another.
	CountedBy string `json:"counted_by"`
}

// ChaosReport is what a chaos run found.
type ChaosReport struct {
	Rows     []ChaosRow     `json:"rows"`
	Kills    map[string]int `json:"kills"`
	Seconds  float64        `json:"seconds"`
	DeadJobs int64          `json:"dead_jobs"`
	// Memory has, per process that was never killed, its resident memory (MiB) sampled every 2 s.
	Memory      map[string][]float64 `json:"memory_mib,omitempty"`
	LostTotal   int                  `json:"lost_total"`
	AnalyticDup int                  `json:"analytics_duplicates"`
	// Resends are the emails and webhooks received more than once: each a gateway killed after the
	// destination accepted and before it recorded that (the crash window). ResendsPerGatewayKill is them
	// over the gateways' SIGKILLs (0 when no gateway was killed).
	Resends               int     `json:"resends"`
	GatewayKills          int     `json:"gateway_kills"`
	ResendsPerGatewayKill float64 `json:"resends_per_gateway_kill"`
	// ResendGapsMs has, for each resend, the time from the destination's first copy to the nearest gateway
	// SIGKILL, negative when the kill came first (none when no gateway was killed): where in the delivery the
	// kill landed. A small positive gap
	// is a kill while the answer went back to the gateway or while it recorded it; a small negative one, a
	// kill while the request was on its way (the destination read it after the gateway died); a long one
	// points at something else than a kill (an attempt that timed out after the destination had it).
	ResendGapsMs []float64 `json:"resend_gaps_ms"`
	// Resent are the keys of the effects resent, to find in the gateways' logs (-v).
	Resent []string `json:"resent"`
}

// OK is true when nothing was lost and no analytics event was recorded twice.
func (r ChaosReport) OK() bool { return r.LostTotal == 0 && r.AnalyticDup == 0 && r.DeadJobs == 0 }

// member is a process the chaos loop kills and restarts.
type member struct {
	name  string
	start func() (*proc, error)
	mu    sync.Mutex
	p     *proc
}

func (m *member) restart() error {
	p, err := m.start()
	if err != nil {
		return fmt.Errorf("%s: %w", m.name, err)
	}
	m.mu.Lock()
	m.p = p
	m.mu.Unlock()
	return nil
}

func (m *member) current() *proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.p
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Chaos runs jobs of all three demo kinds while SIGKILLing workers and gateways at random moments and
// restarting them, then counts per effect type, at the destinations, what was delivered, lost and duplicated.
func Chaos(ctx context.Context, env Env, cfg ChaosConfig) (ChaosReport, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 3
	}
	if cfg.Gateways <= 0 {
		cfg.Gateways = 2
	}
	started := time.Now()
	mail, q, cleanup, err := stage(env, "chaos")
	if err != nil {
		return ChaosReport{}, err
	}
	defer cleanup()
	var hmu sync.Mutex
	hooks := map[string]int{}
	hookFirst := map[string]time.Time{}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hmu.Lock()
		id := r.Header.Get("webhook-id")
		if hooks[id]++; hooks[id] == 1 {
			hookFirst[id] = time.Now()
		}
		hmu.Unlock()
		w.WriteHeader(204)
	}))
	defer receiver.Close()

	pool, hint, err := connectionBudget(ctx, env.DatabaseURL, cfg.Gateways)
	if err != nil {
		return ChaosReport{}, err
	}
	if hint != "" {
		fmt.Fprintln(os.Stderr, "killtest: "+hint)
	}
	dbURL, drop, err := createDatabase(ctx, env.DatabaseURL)
	if err != nil {
		return ChaosReport{}, err
	}
	defer drop()
	gatewayURL, err := withPool(dbURL, pool) // the gateways' pools; killtest's own connections take no such parameter
	if err != nil {
		return ChaosReport{}, err
	}

	secret := "whsec_Y2hhb3Mtd2ViaG9vay1zZWNyZXQtMzItYnl0ZXMh"
	types := map[string]string{
		"welcome-email": fmt.Sprintf(`{provider: smtp, timeout: 5s, smtp: {addr: "%s", from: "Acme <noreply@acme.test>"}}`, mail.Addr),
		"clicks":        `{provider: postgres, timeout: 5s}`,
		"order-webhook": fmt.Sprintf(`{provider: webhook, timeout: 5s, webhook: {url: "%s", secret: "%s", allow_private_networks: true}}`, receiver.URL, secret),
	}
	var members []*member
	var gateways []string
	for i := range cfg.Gateways {
		addr, err := freeAddr()
		if err != nil {
			return ChaosReport{}, err
		}
		gateways = append(gateways, "http://"+addr)
		members = append(members, &member{name: fmt.Sprintf("gateway-%d", i), start: func() (*proc, error) {
			p, _, _, err := StartGateway(env, gatewayURL, addr, types)
			return p, err
		}})
	}
	for i := range cfg.Workers {
		base := gateways[i%len(gateways)]
		members = append(members, &member{name: fmt.Sprintf("worker-%d", i), start: func() (*proc, error) {
			// Each job works 100ms after its effect, so kills land in the middle of jobs.
			return start(env, env.Worker, []string{"run", "--queue", q.Name(), "--concurrency", "8", "--work", "100ms",
				"--log-level", "warn"},
				"REDIS_URL="+env.RedisURL, "GATEWAY_URL="+base, "GATEWAY_API_KEY="+APIKey)
		}})
	}
	for _, m := range members {
		if err := m.restart(); err != nil {
			return ChaosReport{}, err
		}
	}
	defer func() {
		for _, m := range members {
			if p := m.current(); p != nil {
				p.kill()
			}
		}
	}()

	// Kills are random, not caused by the jobs: a job may be in the hands of two killed workers in a row,
	// which is not the "job of death" MaxStalls guards against.
	per := cfg.Jobs / 3
	for i := range per {
		for _, j := range []struct {
			kind    string
			payload any
		}{
			{jobs.KindSignup, jobs.Signup{User: fmt.Sprintf("user_%d", i), Email: email(fmt.Sprintf("user_%d", i))}},
			{jobs.KindClick, jobs.Click{User: fmt.Sprintf("user_%d", i), Link: "/l/" + fmt.Sprint(i)}},
			{jobs.KindOrder, jobs.Order{OrderID: fmt.Sprint(i), Amount: int64(100 + i)}},
		} {
			b, _ := json.Marshal(j.payload)
			if _, err := q.Enqueue(ctx, queue.NewJob{ID: fmt.Sprintf("%s:%d", j.kind, i), Kind: j.kind, Payload: b,
				MaxStalls: 20}); err != nil {
				return ChaosReport{}, err
			}
		}
	}

	kills := map[string]int{}
	var gatewayKilled []time.Time
	memory := map[string][]float64{}
	nextSample := time.Now()
	next := time.Now().Add(jitter(cfg.KillEvery))
	deadline := time.Now().Add(10 * time.Minute)
	for {
		s, err := q.Stats(ctx)
		if err != nil {
			return ChaosReport{}, err
		}
		// Done when nothing is left to run. Completed jobs are not counted: workers keep only so many
		// (retention), and the effects are counted at the destinations anyway.
		if s.Counts[queue.StateReady]+s.Counts[queue.StateDelayed]+s.Counts[queue.StateActive] == 0 {
			break
		}
		if time.Now().After(deadline) {
			return ChaosReport{}, fmt.Errorf("jobs unfinished after 10 minutes: %v", s.Counts)
		}
		if time.Now().After(nextSample) {
			for _, m := range members {
				if kills[m.name] == 0 {
					memory[m.name] = append(memory[m.name], rssMiB(m.current().cmd.Process.Pid))
				}
			}
			nextSample = time.Now().Add(2 * time.Second)
		}
		if cfg.KillEvery > 0 && time.Now().After(next) {
			m := members[rand.IntN(len(members))]
			for cfg.Spare && strings.HasSuffix(m.name, "-0") {
				m = members[rand.IntN(len(members))]
			}
			if strings.HasPrefix(m.name, "gateway-") {
				gatewayKilled = append(gatewayKilled, time.Now()) // before kill, which waits for the exit
			}
			// For -v: a gateway's log names it by its pid (its dispatcher's owner, vm/PID/...).
			fmt.Fprintf(env.Log, "killtest: SIGKILL %s pid %d at %s\n", m.name, m.current().cmd.Process.Pid,
				time.Now().UTC().Format(time.RFC3339Nano))
			m.current().kill()
			kills[m.name]++
			if err := m.restart(); err != nil {
				return ChaosReport{}, err
			}
			next = time.Now().Add(jitter(cfg.KillEvery))
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return ChaosReport{}, err
		}
	}

	// Every job is done; let the outbox drain (deliveries of killed gateways are rescued after their lease).
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return ChaosReport{}, err
	}
	defer conn.Close(ctx)
	for end := time.Now().Add(2 * time.Minute); ; {
		var open int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM oncegate_outbox").Scan(&open); err != nil {
			return ChaosReport{}, err
		}
		if open == 0 {
			break
		}
		if time.Now().After(end) {
			return ChaosReport{}, fmt.Errorf("%d effects still undelivered 2 minutes after the last job", open)
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return ChaosReport{}, err
		}
	}

	st, _ := q.Stats(ctx)
	report := ChaosReport{Kills: kills, DeadJobs: st.Counts[queue.StateDead], Memory: map[string][]float64{}}
	for name, samples := range memory {
		if kills[name] == 0 && len(samples) > 0 {
			report.Memory[name] = samples
		}
	}
	byRecipient := count(mail)
	firstMail := map[string]time.Time{}
	for _, m := range mail.Messages() {
		for _, to := range m.To {
			// The first copy's answer is when the gateway could have known of it: the server's own time
			// between taking the message and saying so (parsing it, here) is its window, not the gateway's.
			at := m.Answered
			if at.IsZero() {
				at = m.Received
			}
			if u := strings.TrimSuffix(to, "@example.com"); firstMail[u].IsZero() || at.Before(firstMail[u]) {
				firstMail[u] = at
			}
		}
	}
	hmu.Lock()
	hookCounts := hooks
	hmu.Unlock()
	// gap is the time from the destination's first copy to the nearest gateway kill, negative when the kill
	// came first (the request was on its way, or read by the destination after the gateway died).
	gap := func(first time.Time) float64 {
		best := time.Duration(math.MaxInt64)
		for _, k := range gatewayKilled {
			if d := k.Sub(first); d.Abs() < best.Abs() {
				best = d
			}
		}
		return math.Round(float64(best.Microseconds())/10) / 100
	}
	email := ChaosRow{Type: "welcome-email (smtp)", Jobs: per, CountedBy: "recipient at the SMTP server"}
	orders := ChaosRow{Type: "order-webhook (webhook)", Jobs: per, CountedBy: "webhook-id at the receiver"}
	clicks := ChaosRow{Type: "clicks (postgres)", Jobs: per, CountedBy: "rows in analytics_events"}
	for i := range per {
		user := fmt.Sprintf("user_%d", i)
		tally(&email, byRecipient[user])
		if byRecipient[user] > 1 && len(gatewayKilled) > 0 {
			report.ResendGapsMs = append(report.ResendGapsMs, gap(firstMail[user]))
			report.Resent = append(report.Resent, fmt.Sprintf("welcome-email:signup:%s", user))
		}
		// A webhook's id is its effect's stable id, which the gateway drew when it created the effect.
		var hookID string
		// The key's effect, through oncegate_keys, as the gateway reads it.
		err := conn.QueryRow(ctx, `SELECT stable_id FROM oncegate_effects
			WHERE id = (SELECT effect_id FROM oncegate_keys WHERE tenant = 'demo' AND key = $1)`,
			fmt.Sprintf("order-webhook:order:%d", i)).Scan(&hookID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return ChaosReport{}, err
		}
		tally(&orders, hookCounts[hookID])
		if hookCounts[hookID] > 1 && len(gatewayKilled) > 0 {
			report.ResendGapsMs = append(report.ResendGapsMs, gap(hookFirst[hookID]))
			report.Resent = append(report.Resent, fmt.Sprintf("order-webhook:order:%d", i))
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM analytics_events WHERE key = $1",
			fmt.Sprintf("click-event:click:%d", i)).Scan(&n); err != nil {
			return ChaosReport{}, err
		}
		tally(&clicks, n)
	}
	report.Rows = []ChaosRow{email, orders, clicks}
	for _, r := range report.Rows {
		report.LostTotal += r.Lost
	}
	report.AnalyticDup = clicks.Duplicated
	report.Resends = email.Duplicated + orders.Duplicated
	for name, n := range kills {
		if strings.HasPrefix(name, "gateway-") {
			report.GatewayKills += n
		}
	}
	if report.GatewayKills > 0 {
		report.ResendsPerGatewayKill = math.Round(float64(report.Resends)/float64(report.GatewayKills)*1000) / 1000
	}
	slices.Sort(report.ResendGapsMs)
	report.Seconds = time.Since(started).Round(100 * time.Millisecond).Seconds()
	return report, nil
}

// rssMiB reads a process's resident memory from /proc, in MiB (0 where /proc is not there).
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func tally(r *ChaosRow, n int) {
	switch {
	case n == 0:
		r.Lost++
	default:
		r.Delivered++
		r.Duplicated += n - 1
	}
}

func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d)+1))
}

// ChaosTable formats a report.
func ChaosTable(r ChaosReport) string {
	var b strings.Builder
	b.WriteString("| effect type             | jobs | delivered | lost | duplicated | counted by |\n")
	b.WriteString("|-------------------------|------|-----------|------|------------|------------|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %-23s | %4d | %9d | %4d | %10d | %s |\n", row.Type, row.Jobs, row.Delivered, row.Lost,
			row.Duplicated, row.CountedBy)
	}
	fmt.Fprintf(&b, "\nresends_per_gateway_kill: %.3f (%d emails and webhooks resent, %d gateway kills)\n",
		r.ResendsPerGatewayKill, r.Resends, r.GatewayKills)
	if len(r.ResendGapsMs) > 0 {
		gaps := make([]string, len(r.ResendGapsMs))
		for i, g := range r.ResendGapsMs {
			gaps[i] = strconv.FormatFloat(g, 'f', 2, 64)
		}
		fmt.Fprintf(&b, "each resend's first copy came this many ms before the nearest gateway kill (negative: after it): %s\n",
			strings.Join(gaps, ", "))
	}
	names := make([]string, 0, len(r.Memory))
	for n := range r.Memory {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := r.Memory[n]
		peak := 0.0
		for _, v := range s {
			peak = max(peak, v)
		}
		fmt.Fprintf(&b, "\nmemory of %s (never killed): %.1f MiB at the first sample, %.1f at the last, %.1f at the peak, %d samples", n, s[0], s[len(s)-1], peak, len(s))
	}
	return b.String()
}
