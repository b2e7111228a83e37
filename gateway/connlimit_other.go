//go:build !unix

package gateway

// openFileLimit is unknown here: the configured cap is used as it is.
func openFileLimit() (uint64, bool) { return 0, false }
