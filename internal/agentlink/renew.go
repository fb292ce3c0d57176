package agentlink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// renewTimeout bounds one renewal call.
const renewTimeout = 30 * time.Second

// renewLoop renews the agent's certificate once two thirds of its lifetime have passed
// (pki.RenewAt), or at once when the control plane's CAs differ from the agent's (checkCA), for
// as long as the link runs: a connected agent never outlives its certificate. A failed renewal is tried again with the reconnect backoff until it succeeds,
// the certificate expires, or the gateway refuses the identity (revoked: its streams are refused
// too, and the link stops on its own).
func (l *Link) renewLoop() {
	defer l.bg.Done()
	attempt := 0
	for {
		leaf := l.id.Load().tls.Leaf
		wait := time.Until(pki.RenewAt(leaf.NotBefore, leaf.NotAfter))
		if attempt > 0 {
			wait = backoff(l.cfg.MinBackoff, l.cfg.MaxBackoff, attempt-1)
		}
		t := time.NewTimer(wait)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-l.renewNow:
			t.Stop()
		}
		err := l.renew()
		switch {
		case err == nil:
			attempt = 0
		case l.ctx.Err() != nil:
			return
		case errors.Is(err, ErrRefused):
			l.log.LogAttrs(l.ctx, slog.LevelError, "the gateway refused to renew the agent's certificate", slog.Any("error", err), slog.Time("not_after", leaf.NotAfter))
			return
		case time.Now().After(leaf.NotAfter):
			l.log.LogAttrs(l.ctx, slog.LevelError, "the agent's certificate expired before it could be renewed: the agent must join again with a new token", slog.Any("error", err), slog.Time("not_after", leaf.NotAfter))
			return
		default:
			attempt++
			l.log.LogAttrs(l.ctx, slog.LevelWarn, "renewing the agent's certificate failed; retrying", slog.Any("error", err), slog.Time("not_after", leaf.NotAfter))
		}
	}
}

// renew asks the gateway to certify the agent's identity and key again and, once the new
// certificate is stored (DataDir), presents it at every new connection and attestation.
func (l *Link) renew() error {
	ctx, cancel := context.WithTimeout(l.ctx, renewTimeout)
	defer cancel()
	resp, err := l.client().Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{}))
	if err != nil {
		return classify(fmt.Errorf("renewing the agent certificate: %w", err))
	}
	cur := l.id.Load()
	next := &identity{key: cur.key, certDER: resp.Msg.GetCertDer(), caPEM: cur.caPEM}
	if err := next.parse(); err != nil {
		return fmt.Errorf("renewing the agent certificate: the gateway's certificate: %w", err)
	}
	// The answer came over a connection the agent's CAs verified: the CAs it names replace them
	// (a rotation of the agent CA), unless they would not let the agent prove who it is.
	if ca := resp.Msg.GetCaPem(); len(ca) > 0 && !bytes.Equal(ca, cur.caPEM) {
		if err := pki.CheckBundle(ca, next.tls.Leaf); err != nil {
			l.log.LogAttrs(l.ctx, slog.LevelWarn, "the gateway's renewal answer names CAs the agent does not take; keeping its own", slog.Any("error", err))
		} else {
			next.caPEM = ca
			l.log.LogAttrs(l.ctx, slog.LevelInfo, "the agent trusts the control plane's CAs from now on", slog.Any("ca_sha256", pki.BundleFingerprints(ca)))
		}
	}
	if next.id != cur.id {
		return fmt.Errorf("renewing the agent certificate: the gateway certified %s, not %s", next.id, cur.id)
	}
	if err := next.store(l.cfg.DataDir); err != nil {
		return fmt.Errorf("renewing the agent certificate: %w", err)
	}
	l.id.Store(next)
	l.log.LogAttrs(l.ctx, slog.LevelInfo, "agent certificate renewed", slog.Time("not_after", next.tls.Leaf.NotAfter))
	// The stream's connection presented the old certificate: it reconnects on a new wire.
	select {
	case l.renewed <- struct{}{}:

	default: // a reconnect is already due
	}
	return nil
}
