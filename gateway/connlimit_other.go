//go:build !unix

package gateway

import "net"

// openFileLimit is unknown here: the configured cap is used as it is.
func openFileLimit() (uint64, bool) { return 0, false }

// backlogged cannot tell whether a connection waits in l's accept queue: it says one does.
func backlogged(net.Listener) bool { return true }
