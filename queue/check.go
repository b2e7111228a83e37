package queue

import (
	"bufio"
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CheckRedis returns warnings about Redis settings that can lose jobs: an eviction policy other than
// noeviction (Redis may delete queue keys under memory pressure) and persistence that is off or snapshot-only
// (a restart loses what was acknowledged since). Workers log them at start; managed Redis services that forbid
// CONFIG yield a warning saying the policy could not be read.
func CheckRedis(ctx context.Context, rdb redis.UniversalClient) []string {
	var warnings []string
	policy, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	switch {
	case err != nil:
		warnings = append(warnings, fmt.Sprintf(
			"could not read Redis maxmemory-policy (%v); it must be noeviction, or Redis may evict queued jobs", err))
	case policy["maxmemory-policy"] != "noeviction":
		warnings = append(warnings, fmt.Sprintf(
			"Redis maxmemory-policy is %q: under memory pressure Redis may evict queue keys and lose jobs; "+
				"set maxmemory-policy noeviction", policy["maxmemory-policy"]))
	}

	info, err := rdb.Info(ctx, "persistence").Result()
	if err != nil {
		return append(warnings, fmt.Sprintf("could not read Redis persistence settings: %v", err))
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			fields[k] = v
		}
	}
	if fields["aof_enabled"] == "1" {
		return warnings
	}
	save, err := rdb.ConfigGet(ctx, "save").Result()
	if err == nil && strings.TrimSpace(save["save"]) == "" {
		return append(warnings, "Redis persistence is off (no AOF, no RDB snapshots): a Redis restart loses "+
			"every job; run Redis with --appendonly yes")
	}
	return append(warnings, "Redis AOF is off: jobs acknowledged since the last RDB snapshot are lost if Redis "+
		"restarts; run Redis with --appendonly yes")
}
