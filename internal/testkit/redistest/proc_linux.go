package redistest

import "syscall"

// sysProcAttr puts the server in a process group of its own, so Kill reaches a child it forked for an AOF
// rewrite too, and has the kernel kill it if the test binary dies first (a -timeout panic runs no cleanups),
// so no server outlives its test holding a port.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
