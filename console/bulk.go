package console

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/oncegate/oncegate/admin"
)

// A retry of all matching effects runs past the request that started it, in batches (admin.RetryEffects,
// each batch audited), while its page polls for progress. Runs are kept an hour after they end.

type bulkRun struct {
	ID      string
	Actor   string
	Filter  admin.EffectFilter
	Reason  string
	Started time.Time
	Result  admin.BulkResult
	Done    bool
	Err     string
}

type bulkRuns struct {
	mu   sync.Mutex
	runs map[string]*bulkRun
}

func newBulkRuns() *bulkRuns { return &bulkRuns{runs: map[string]*bulkRun{}} }

func (b *bulkRuns) get(id string) (bulkRun, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.runs[id]
	if !ok {
		return bulkRun{}, false
	}
	return *r, true
}

func (b *bulkRuns) update(id string, f func(*bulkRun)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.runs[id]; ok {
		f(r)
	}
}

func (s *Server) startBulk(a admin.Actor, f admin.EffectFilter, reason string) string {
	raw := make([]byte, 12)
	_, _ = rand.Read(raw)
	id := hex.EncodeToString(raw)
	run := &bulkRun{ID: id, Actor: a.Name, Filter: f, Reason: reason, Started: time.Now()}
	s.bulk.mu.Lock()
	for k, r := range s.bulk.runs {
		if r.Done && time.Since(r.Started) > time.Hour {
			delete(s.bulk.runs, k)
		}
	}
	s.bulk.runs[id] = run
	s.bulk.mu.Unlock()
	s.wg.Go(func() {
		res, err := s.adm.RetryEffects(s.ctx, a, f, reason, func(p admin.BulkResult) {
			s.bulk.update(id, func(r *bulkRun) { r.Result = p })
		})
		s.bulk.update(id, func(r *bulkRun) {
			r.Result, r.Done = res, true
			if err != nil {
				r.Err = err.Error()
			}
		})
		s.log.Info("console: retry of all matching ended", "operator", a.Name, "matched", res.Matched,
			"applied", res.Applied, "err", err)
	})
	return id
}

func (s *Server) bulkRun(w http.ResponseWriter, r *http.Request, a admin.Actor) (bulkRun, bool) {
	run, ok := s.bulk.get(r.PathValue("id"))
	if !ok {
		s.fail(w, r, a, &admin.NotFoundError{What: "bulk action " + r.PathValue("id") +
			" (it ended more than an hour ago, or the console restarted: the audit log has it)"})
	}
	return run, ok
}

func (s *Server) bulkPage(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if run, ok := s.bulkRun(w, r, a); ok {
		s.render(w, r, http.StatusOK, "bulk", s.frame(a, "Retry of all matching", "effects", run))
	}
}

func (s *Server) bulkFragment(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if run, ok := s.bulkRun(w, r, a); ok {
		s.renderBlock(w, r, http.StatusOK, "bulk", "progress", s.frame(a, "Retry of all matching", "effects", run))
	}
}
