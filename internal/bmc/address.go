package bmc

import "strings"

// ShownAddress is a BMC address as errors, events and logs show it: without user information
// (user[:password]@) and without query or fragment, any of which may hold a credential (the
// control plane refuses such addresses; an address typed on the command line, or stored before,
// may still carry them). Pure.
func ShownAddress(addr string) string {
	scheme, rest := "", addr
	if i := strings.Index(rest, "://"); i >= 0 {
		scheme, rest = rest[:i+3], rest[i+3:]
	}
	// The last '@' ends the user information: a password may hold '@', '/', '?' or '#'.
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		rest = rest[at+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	return scheme + rest
}
