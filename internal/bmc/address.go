package bmc

import (
	"net/url"
	"slices"
	"strings"
)

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

// MinSecret is the shortest part of an address AddressSecrets gives: a shorter one ("1" of
// ?x=1) would take every such byte of a message with it when replaced.
const MinSecret = 4

// AddressSecrets is what of a BMC address (or any URL a driver sends) may be a credential: its
// user information and the password in it (raw and unescaped), its query, each of the query's
// parameters and values (raw and unescaped), its fragment; each of at least MinSecret bytes, sorted, once each. It
// reads the address as ShownAddress does: the last '@' ends the user information. Pure.
func AddressSecrets(addr string) []string {
	var out []string
	rest := addr
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user := rest[:at]
		out = append(out, user)
		if _, pw, ok := strings.Cut(user, ":"); ok {
			out = append(out, pw)
			if u, err := url.PathUnescape(pw); err == nil {
				out = append(out, u)
			}
		}
		rest = rest[at+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		tail := rest[i+1:]
		out = append(out, tail)
		for _, part := range strings.FieldsFunc(tail, func(r rune) bool { return strings.ContainsRune("&;?#", r) }) {
			out = append(out, part)
			if _, v, ok := strings.Cut(part, "="); ok {
				out = append(out, v)
				if u, err := url.QueryUnescape(v); err == nil {
					out = append(out, u)
				}
			}
		}
	}
	out = slices.DeleteFunc(out, func(s string) bool { return len(s) < MinSecret })
	slices.Sort(out)
	return slices.Compact(out)
}
