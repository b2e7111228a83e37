package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The machine has two cores, shared by the load, the gateway and Postgres: when fsync is cheap the phases
// are bound by CPU, and which process spent it says where to look. cpuSample reads it from /proc.

// cpuSample is the CPU time each side has spent so far.
type cpuSample struct {
	gateway, postgres, load time.Duration
}

// ticks is the kernel's clock tick: /proc reports CPU time in them.
const ticks = 100

// sampleCPU reads the CPU time of the gateway process (pid; 0 for none), of Postgres (every live process
// named postgres, and the postmaster's count for its children that have exited: pgbench's backends end
// with it), and of the load: this process and its children that have exited (pgbench).
func sampleCPU(gatewayPid int) cpuSample {
	var s cpuSample
	if gatewayPid > 0 {
		s.gateway = procCPU(strconv.Itoa(gatewayPid), false)
	}
	s.load = procCPU("self", false) + procCPU("self", true) // pgbench, once it has exited
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(d + "/comm")
		if err != nil || string(bytes.TrimSpace(comm)) != "postgres" {
			continue
		}
		pid := filepath.Base(d)
		s.postgres += procCPU(pid, false)
		if isPostmaster(pid) {
			s.postgres += procCPU(pid, true)
		}
	}
	return s
}

// isPostmaster says whether a postgres process is the postmaster: its parent is not a postgres process.
func isPostmaster(pid string) bool {
	f := statFields(pid)
	if len(f) < 2 {
		return false
	}
	comm, err := os.ReadFile("/proc/" + f[1] + "/comm")
	return err != nil || string(bytes.TrimSpace(comm)) != "postgres"
}

// procCPU is a process's user and system time, or with children its exited children's.
func procCPU(pid string, children bool) time.Duration {
	f := statFields(pid)
	if len(f) < 15 {
		return 0
	}
	i := 11 // utime, stime; cutime, cstime follow (fields 14 to 17 of proc(5), counted here from state)
	if children {
		i = 13
	}
	u, _ := strconv.ParseInt(f[i], 10, 64)
	s, _ := strconv.ParseInt(f[i+1], 10, 64)
	return time.Duration(u+s) * time.Second / ticks
}

// statFields are the fields of /proc/pid/stat after the command name: state, ppid, …
func statFields(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces and parentheses
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// perRequest is a phase's CPU a request on each side, as µs gateway / Postgres / load.
func perRequest(before, after cpuSample, requests float64) string {
	if requests <= 0 {
		return ""
	}
	us := func(d time.Duration) int { return int(float64(d.Microseconds()) / requests) }
	return strconv.Itoa(us(after.gateway-before.gateway)) + " / " + strconv.Itoa(us(after.postgres-before.postgres)) +
		" / " + strconv.Itoa(us(after.load-before.load))
}
