//go:build unix

package gateway

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// openFileLimit is the process's soft RLIMIT_NOFILE (which the Go runtime raises to the hard limit at start).
func openFileLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true // int64 on some systems, so converted
}

// backlogged reports whether a connection waits in l's accept queue: the listening socket polls readable. It
// says true when it cannot tell.
func backlogged(l net.Listener) bool {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	ready := true
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		ready = err != nil || n > 0
	})
	return ready
}
