//go:build unix && !linux

package redistest

import "syscall"

// sysProcAttr puts the server in a process group of its own, so Kill reaches a child it forked for an AOF
// rewrite too. Only Linux can also tie the server's life to the test binary's.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
