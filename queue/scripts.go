package queue

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// script loads lua/NAME.lua with lua/lib.lua prepended. go-redis runs it by EVALSHA and loads it on NOSCRIPT,
// so a Redis restart (which empties the script cache) needs no special handling.
func script(name string) *redis.Script {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(lib) + "\n" + string(body))
}

var (
	enqueueScript     = script("enqueue")
	leaseScript       = script("lease")
	completeScript    = script("complete")
	failScript        = script("fail")
	heartbeatScript   = script("heartbeat")
	sweepBeginScript  = script("sweep_begin")
	sweepScript       = script("sweep")
	registerScript    = script("register")
	releaseScript     = script("release")
	requeueDeadScript = script("requeue_dead")
	purgeDeadScript   = script("purge_dead")
	resumeScript      = script("resume")
)
