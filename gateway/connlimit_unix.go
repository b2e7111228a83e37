//go:build unix

package gateway

import "syscall"

// openFileLimit is the process's soft RLIMIT_NOFILE (which the Go runtime raises to the hard limit at start).
func openFileLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true // int64 on some systems, so converted
}
