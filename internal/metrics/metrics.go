// Package metrics holds the worker process's Prometheus collectors, all named oncegate_*. The gateway's
// collectors are not here: they are built per gateway (gateway's own and outbox.Metrics) and registered on
// that gateway's registry, so that two gateways in one process never share a counter and the gateway does not
// link the queue's packages through this one.
package metrics
