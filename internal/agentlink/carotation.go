package agentlink

import (
	"log/slog"
	"slices"
	"strings"
	"time"

	"bcd/internal/pki"
)

// caMismatch says why the agent's CAs differ from the control plane's ("" they agree): the
// CAs it trusts are not the ones the control plane trusts (a rotation staged or finished), or
// its certificate was issued by another CA than the one signing now (a rotation activated).
// trusted and active are the heartbeat answer's; an answer without them (an older control
// plane) never differs. Pure.
func caMismatch(held []string, issuer string, trusted []string, active string) string {
	if len(trusted) == 0 || active == "" {
		return ""
	}
	a, b := slices.Clone(held), slices.Clone(trusted)
	slices.Sort(a)
	slices.Sort(b)
	switch {
	case !slices.Equal(a, b):
		return "trusted " + strings.Join(b, ",")
	case issuer != active:
		return "active " + active
	}
	return ""
}

// checkCA acts on a heartbeat answer's CAs: when they differ from the agent's, the renewal loop
// renews now (the answer carries the CAs, and a certificate of the active one). The same
// mismatch wakes it again only after MaxBackoff (a renewal answered by a server that has not
// yet seen the change leaves it as it was).
func (l *Link) checkCA(trusted []string, active string) {
	id := l.id.Load()
	why := caMismatch(pki.BundleFingerprints(id.caPEM), pki.IssuerInBundle(id.tls.Leaf, id.caPEM), trusted, active)
	if why == "" {
		return
	}
	l.mu.Lock()
	now := time.Now()
	again := why == l.caAsked && now.Sub(l.caAskedAt) < l.cfg.MaxBackoff
	if !again {
		l.caAsked, l.caAskedAt = why, now
	}
	l.mu.Unlock()
	if again {
		return
	}
	l.log.LogAttrs(l.ctx, slog.LevelInfo, "the control plane's CAs differ from the agent's: renewing the certificate now", slog.String("differs", why))
	select {
	case l.renewNow <- struct{}{}:
	default: // already due
	}
}
