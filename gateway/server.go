package gateway

// Serving: the HTTP server on a listener, with every client-controlled wait and size bounded, the
// background loops beside it, and the graceful shutdown.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Serve runs the HTTP API on l and the dispatcher until ctx ends, then shuts down gracefully: it stops
// accepting, lets requests in flight finish (up to timeouts.shutdown), stops the dispatcher (which drains its
// deliveries and hands back the rest) and returns.
//
// Everything a client controls is bounded: the time to send headers (timeouts.read_header) and the whole
// request (timeouts.read), the time until the answer is written (timeouts.write), how long a keep-alive
// connection may sit idle (timeouts.idle), the size of headers (limits.max_header) and of bodies
// (limits.max_body), and the number of open connections (limits.max_connections).
//
// With metrics_listen set, it also serves /metrics and the probes there, and returns at once when that address
// cannot be listened on.
func (g *Gateway) Serve(ctx context.Context, l net.Listener) error {
	t := g.cfg.Timeouts
	var metrics *http.Server
	if addr := g.cfg.MetricsListen; addr != "" {
		ml, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("metrics_listen: %q: %w", addr, err)
		}
		metrics = &http.Server{Handler: g.metricsRoutes(), ReadHeaderTimeout: time.Duration(t.ReadHeader),
			ReadTimeout: time.Duration(t.Read), WriteTimeout: time.Duration(t.Write), IdleTimeout: time.Duration(t.Idle),
			MaxHeaderBytes: int(g.cfg.Limits.MaxHeader), ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
		g.log.Info("metrics listening", "metrics_listen", addr, "addr", ml.Addr().String())
		go func() { _ = metrics.Serve(ml) }()
	} else if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && !ap.Addr().IsLoopback() {
		g.log.Warn("/metrics is served on the API's address, to every client that reaches it, and names every " +
			"tenant, destination and breaker: set metrics_listen to an address only the scraper reaches")
	}
	srv := &http.Server{Handler: g.handler, ReadHeaderTimeout: time.Duration(t.ReadHeader),
		ReadTimeout: time.Duration(t.Read), WriteTimeout: time.Duration(t.Write), IdleTimeout: time.Duration(t.Idle),
		MaxHeaderBytes: int(g.cfg.Limits.MaxHeader),
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
	// The gate (conngate.go) holds the connections: those that hold no request are closed, oldest first, to
	// make room, and each tenant's waits are bounded (held.go), so that no tenant's connections, nor anyone's
	// idle ones, keep another tenant's requests in the accept queue. Only when every connection serves a
	// request does Accept wait, and the kernel hold further connections in the listen backlog, costing this
	// process no descriptor.
	conns := g.connectionCap()
	g.held.setCeiling(conns)
	gate := newConnGate(l, conns, g.held.shedOne, g.metrics.connectionsClosed, g.metrics.connections)
	g.gate = gate
	srv.ConnState, srv.ConnContext, srv.Handler = gate.connStateHook, gate.connContext, gate.serve(g.handler)
	l = gate
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	// The first request writes by the fleet's retentions already; the heartbeat reads them again.
	func() {
		fctx, cancel := context.WithTimeout(bg, 2*time.Second)
		defer cancel()
		g.followFleet(fctx)
	}()
	// New effects are announced until the last request has been answered, and what is queued then is sent.
	announce, stopAnnounce := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAnnounce()
	var wg sync.WaitGroup
	wg.Go(func() { g.newEffects.Run(announce) })
	wg.Go(func() { g.replays.Run(announce) })
	wg.Go(func() { g.listen(bg) })
	wg.Go(func() { g.poll(bg) })
	wg.Go(func() { g.heartbeat(bg, l.Addr().String()) })
	wg.Go(func() { g.watchReplication(bg) })
	wg.Go(func() { g.managePartitions(bg) })
	if g.cfg.Dispatcher.Disabled {
		g.log.Info("dispatcher disabled: this gateway records effects, other gateways deliver them")
	} else {
		// The attempt log outlives the dispatcher, so that the attempts of its last deliveries are written.
		attemptsCtx, stopAttempts := context.WithCancel(context.WithoutCancel(ctx))
		wg.Go(func() { g.attempts.Run(attemptsCtx) })
		wg.Go(func() { defer stopAttempts(); _ = g.dispatcher.Run(bg) })
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	// Stopped for the fleet as the stop begins: the drain that follows takes no new work, and may last as long
	// as the longest delivery in flight, while its heartbeats end with the loops below; marked at its end, a
	// draining gateway read as alive, then as killed.
	marked := g.markStopped()
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(g.cfg.Timeouts.Shutdown))
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		g.log.Warn("HTTP shutdown", "err", serr)
	}
	stopAnnounce()
	stopBG()
	wg.Wait()
	if metrics != nil {
		// Last, so that the drain above is scraped and probed to its end.
		_ = metrics.Close()
	}
	if !marked {
		g.markStopped()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
