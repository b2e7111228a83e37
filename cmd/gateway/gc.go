package main

import "runtime/debug"

// The gateway's live heap is small (a few MiB: pools, caches, the requests in flight), and nearly all it
// allocates is garbage by the time a request is answered. Go's default (GOGC=100: collect each time the heap
// doubles) then collects dozens of times a second under load: a quarter of the gateway's CPU in gatewaybench
// at 32 clients (192 µs a request with the default, 138 µs with 400; resident memory 30 and 41 MiB). The
// gateway shares its machine's cores with Postgres, so it trades memory for that CPU, and a soft memory limit
// bounds the trade: near the limit the collector runs as often as it must to keep garbage under it (what is
// live, the bodies of the requests in flight, it cannot bound; docs/configuration.md has figures).
const (
	gcPercent   = 400
	memoryLimit = 256 << 20
)

// tuneGC applies the defaults above, each unless the operator set its environment variable (GOGC, GOMEMLIMIT),
// which the Go runtime has already applied and which then wins. The limit is set only with the default
// percentage: it caps what that percentage may cost, and an operator who chose GOGC chose its memory too.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(gcPercent)
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimit)
	}
}
