package agentlink_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"bcd/internal/agentlink"
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

	poll(t, 10*time.Second, "first renewal", func() bool { return !bytes.Equal(l.CertDER(), first.Raw) })
	second := certOf(t, l.CertDER())
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
	if n := env.Identities.Renewals(); n < 2 {
		t.Fatalf("%d renewals in %s of %s certificates, want the renewed one renewed too", n, time.Since(first.NotBefore.Add(pki.ClockSkew)), ttl)
	}
	stop(t, cancel, l)
}
