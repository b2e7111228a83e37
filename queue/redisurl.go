package queue

import (
	"fmt"
	"net/url"
	"strings"

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
		return redis.NewFailoverClient(o), nil
	}
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	return redis.NewClient(o), nil
}
