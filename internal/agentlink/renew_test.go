package agentlink_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
)

func certOf(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// poll calls cond every 10 ms until it holds, failing the test after d.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An agent renews its certificate once two thirds of its life have passed, keeps the renewed
// one in its DataDir, and so connects after the certificate it joined with has expired: on a
// new connection of the same link, and after a restart. It renews the renewed one in turn.
func TestCertificateRenewal(t *testing.T) {
	env := start(t)
	const ttl = 3 * time.Second
	env.Identities.SetCertTTL(ttl)
	dir := t.TempDir()
	h := newCounter()
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, dir), h)
	first := certOf(t, l.CertDER())
	poll(t, 5*time.Second, "the first stream", func() bool { return l.Sessions() == 1 && env.Queue.Counts().Open[gatewaytest.AgentKey(siteRef)] == 1 })

	poll(t, 10*time.Second, "first renewal", func() bool { return !bytes.Equal(l.CertDER(), first.Raw) })
	second := certOf(t, l.CertDER())
	// The stream's connection presented the first certificate: the agent ends it and connects
	// again, presenting the renewed one, before the first expires.
	poll(t, time.Until(first.NotAfter), "a new stream after the renewal", func() bool {
		return l.Sessions() >= 2 && env.Queue.Counts().Open[gatewaytest.AgentKey(siteRef)] == 1
	})
	switch {
	case !second.NotAfter.After(first.NotAfter):
		t.Fatalf("renewed until %s, the first was valid until %s", second.NotAfter, first.NotAfter)
	case second.NotBefore.Add(pki.ClockSkew).After(first.NotAfter):
		t.Fatalf("renewed at %s, after the first expired (%s)", second.NotBefore.Add(pki.ClockSkew), first.NotAfter)
	case !second.PublicKey.(*ecdsa.PublicKey).Equal(first.PublicKey):
		t.Fatal("the renewed certificate names another key")
	case l.Identity() != pki.SiteAgentIdentity(siteRef.SiteID, siteRef.AgentID):
		t.Fatalf("identity after renewal: %s", l.Identity())
	}
	stored, err := os.ReadFile(filepath.Join(dir, agentlink.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	if der, err := pki.DecodeCertPEM(stored); err != nil || bytes.Equal(der, first.Raw) {
		t.Fatalf("the data dir still holds the first certificate (%v)", err)
	}

	// Past the first certificate's end, a new connection presents a renewed one.
	<-time.After(time.Until(first.NotAfter.Add(time.Second)))
	sessions := l.Sessions()
	env.Kill()
	env.Queue.Enqueue(siteRef, commands("after-expiry", 3)...)
	waitFinal(t, env.Queue, 3)
	if l.Sessions() <= sessions {
		t.Fatalf("no new stream after the connections were cut (%d sessions)", l.Sessions())
	}
	stop(t, cancel, l)

	// A restart reads the renewed certificate from the data dir.
	ctx, cancel = context.WithCancel(context.Background())
	l = dial(t, ctx, siteConfig(t, env, dir), h)
	env.Queue.Enqueue(siteRef, commands("after-restart", 3)...)
	waitFinal(t, env.Queue, 6)
	// The renewed certificate falls due (two thirds of its life, in whole seconds) a second after
	// the first one's end: the very moment the test woke to cut the connections. Its renewal, by
	// the first link or at once by this one, races the commands: waited for, not assumed done.
	poll(t, 10*time.Second, "a renewal of the renewed certificate", func() bool { return env.Identities.Renewals() >= 2 })
	stop(t, cancel, l)
}

// An agent stopped for longer than its certificate lives joins again when given a new token,
// keeping its data dir (its journal: what it ran before is not run again). With a token the
// gateway refuses (the first one, used), it fails at once, saying its certificate expired, and
// keeps the certificate.
func TestExpiredAgentJoinsAgain(t *testing.T) {
	env := start(t)
	env.Identities.SetCertTTL(2 * time.Second)
	dir := t.TempDir()
	h := newCounter()
	cfg := siteConfig(t, env, dir)
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, cfg, h)
	before := commands("before", 2)
	env.Queue.Enqueue(siteRef, before...)
	waitFinal(t, env.Queue, 2)
	stop(t, cancel, l)
	certPath := filepath.Join(dir, agentlink.CertFile)
	stored, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	der, err := pki.DecodeCertPEM(stored)
	if err != nil {
		t.Fatal(err)
	}
	old := certOf(t, der)
	<-time.After(time.Until(old.NotAfter.Add(100 * time.Millisecond)))

	_, err = agentlink.Dial(context.Background(), cfg, h)
	if !errors.Is(err, agentlink.ErrRefused) || !strings.Contains(err.Error(), "certificate expired on") {
		t.Fatalf("an expired agent with a used token: %v", err)
	}
	if kept, err := os.ReadFile(certPath); err != nil || !bytes.Equal(kept, stored) {
		t.Fatalf("the expired certificate was not kept after the refused join (%v)", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	l = dial(t, ctx, siteConfig(t, env, dir), h)
	renewed := certOf(t, l.CertDER())
	if !renewed.NotAfter.After(time.Now()) || bytes.Equal(renewed.Raw, old.Raw) {
		t.Fatalf("after joining again: certificate until %s", renewed.NotAfter)
	}
	env.Queue.Enqueue(siteRef, commands("after", 2)...)
	waitFinal(t, env.Queue, 4)
	stop(t, cancel, l)
	checkOnce(t, env.Queue, h, append(before, commands("after", 2)...))
}
