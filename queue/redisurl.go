package queue

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisURLForms documents the URLs OpenRedis takes, for flag and command help.
const RedisURLForms = `redis://[user:pass@]host:port[/db] (one server; rediss:// for TLS); ` +
	`redis://[user:pass@]sentinel:port?master_name=NAME[&addr=sentinel2:port...] (Sentinel: the host and each ` +
	`addr are Sentinels, which name the primary and follow its failovers); ` +
	`redis+cluster://[user:pass@]node:port[?addr=node2:port...] (Redis Cluster: any nodes, the rest are found)`

// OpenRedis returns a client for a Redis URL in one of the forms of RedisURLForms. go-redis parses each form
// (ParseURL, ParseFailoverURL, ParseClusterURL); only the choice among them is made here: a master_name
// parameter means Sentinel, the redis+cluster scheme means Cluster.
func OpenRedis(rawURL string) (redis.UniversalClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	if base, ok := strings.CutSuffix(u.Scheme, "+cluster"); ok {
		u.Scheme = base
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("redis cluster URL: %w", err)
		}
		return redis.NewClusterClient(o), nil
	}
	if u.Query().Has("master_name") {
		o, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("redis sentinel URL: %w", err)
		}
		if o.ReplicaOnly || o.RouteByLatency || o.RouteRandomly {
			// Every queue call writes (a lease, a heartbeat): sent to a replica, each fails with READONLY.
			return nil, fmt.Errorf("redis sentinel URL: replica_only, route_by_latency and route_randomly send " +
				"commands to replicas, and the queue writes with every call: leave them out")
		}
		return redis.NewFailoverClient(o), nil
	}
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	return redis.NewClient(o), nil
}

// CheckSentinels asks the Sentinels of a Sentinel URL (OpenRedis's second form) for its master: an error when
// Sentinels answer and none knows a master by that name, which go-redis reports only as "all sentinels
// specified in configuration are unreachable: redis: nil", call after call. Sentinels that do not answer are
// no error: they may be starting. Other URL forms are not checked.
func CheckSentinels(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || !u.Query().Has("master_name") {
		return nil
	}
	o, err := redis.ParseFailoverURL(rawURL)
	if err != nil {
		return fmt.Errorf("redis sentinel URL: %w", err)
	}
	answered := 0
	var known []string
	for _, addr := range o.SentinelAddrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Username: o.SentinelUsername,
			Password: o.SentinelPassword, MaxRetries: -1, DialTimeout: 2 * time.Second, TLSConfig: o.TLSConfig})
		_, err := sc.GetMasterAddrByName(ctx, o.MasterName).Result()
		if err == nil {
			_ = sc.Close()
			return nil
		}
		if errors.Is(err, redis.Nil) {
			answered++
			if masters, err := sc.Masters(ctx).Result(); err == nil {
				known = append(known, masterNames(masters)...)
			}
		}
		_ = sc.Close()
	}
	if answered == 0 {
		return nil
	}
	slices.Sort(known)
	return fmt.Errorf("redis sentinel URL: %d Sentinel(s) answered and none knows a master named %q (they "+
		"know: %s): check master_name", answered, o.MasterName, strings.Join(slices.Compact(known), ", "))
}

// masterNames reads the names out of SENTINEL MASTERS' answer (a list of flat name, value lists).
func masterNames(masters []any) []string {
	var names []string
	for _, m := range masters {
		if kv, ok := m.(map[any]any); ok { // RESP3
			if v, ok := kv["name"].(string); ok {
				names = append(names, v)
			}
			continue
		}
		fields, ok := m.([]any)
		if !ok {
			continue
		}
		for i := 0; i+1 < len(fields); i += 2 {
			if k, _ := fields[i].(string); k == "name" {
				if v, ok := fields[i+1].(string); ok {
					names = append(names, v)
				}
			}
		}
	}
	return names
}
