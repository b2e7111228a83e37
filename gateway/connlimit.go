package gateway

import "math"

// fdSlack is the descriptors a gateway needs besides client connections, its database pool and its
// deliveries: the listener, the LISTEN connection, logs, telemetry exporters, DNS.
const fdSlack = 32

// connectionCap is limits.max_connections, lowered when the process's open-file limit could not hold that
// many client connections besides the database pool and one connection per delivery in flight (of the
// kinds that open one). A process out
// of descriptors fails at accept, and then the connections waiting for a slot fail with it instead of waiting.
func (g *Gateway) connectionCap() int {
	want := g.cfg.Limits.MaxConnections
	nofile, ok := openFileLimit()
	if !ok {
		return want
	}
	reserve := int(g.pool.Config().MaxConns) + fdSlack
	for _, t := range g.cfg.EffectTypes {
		// A postgres type's deliveries are rows in the pool's transactions, not connections of their own.
		if k, _ := kindNamed(t.Provider); !k.pooled {
			reserve += t.Concurrency
		}
	}
	got := capConnections(want, nofile, reserve)
	if got < want {
		g.log.Warn("limits.max_connections lowered to fit the open-file limit; raise the limit (ulimit -n) to "+
			"serve more", "max_connections", want, "open_file_limit", nofile, "reserved", reserve, "cap", got)
	}
	return got
}

// capConnections fits want client connections into nofile descriptors, reserve of which are spoken for. It
// leaves at least one, so a gateway with too few descriptors still serves, slowly, rather than not at all.
func capConnections(want int, nofile uint64, reserve int) int {
	room := int(min(nofile, math.MaxInt32)) - reserve
	return max(min(want, room), 1)
}
