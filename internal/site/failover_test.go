package site_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/site"
)

// noRelease hides MemoryLease.Release: an agent that dies never hands the lease back.
type noRelease struct{ site.Lease }

// TestBootLeaseFailover runs two agents of one site sharing a lease with a 5 s TTL. Both get
// the machine's ramdisk entry; only the holder serves it. The holder is killed (it does not
// release the lease) and the time until the other serves /boot.ipxe to the machine still
// waiting in PXE is measured: it must stay under TTL + one renewal period + slack (< 10 s).
func TestBootLeaseFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lease TTL")
	}
	const ttl = 5 * time.Second
	env := startGateway(t)
	log := logger(t, &syncBuffer{})
	lease := site.NewMemoryLease(nil)

	cfgA := agentConfig(t, env, "a1", t.TempDir(), log)
	cfgA.Lease, cfgA.LeaseTTL = noRelease{lease}, ttl
	a := startAgent(t, cfgA, "a1")
	waitHolder(t, lease, "a1")
	cfgB := agentConfig(t, env, "a2", t.TempDir(), log)
	cfgB.Lease, cfgB.LeaseTTL = lease, ttl
	b := startAgent(t, cfgB, "a2")

	const mac = "52:54:00:bb:00:01"
	token, _, _ := pki.NewToken(pki.DiscoveryTokenPrefix)
	args := map[string]any{"nodeId": "n1", "macs": []string{mac}, "token": token}
	for _, ag := range []*testAgent{a, b} {
		if u := do(t, env, ag, "prep-"+ag.ref.AgentID, site.KindPrepareRamdisk, "n1", args); u.State != gateway.StateSucceeded {
			t.Fatalf("prepareRamdisk on %s: %s %q", ag.ref.AgentID, u.State, u.Error)
		}
	}
	baseA, baseB := "http://"+a.HTTPAddr().String(), "http://"+b.HTTPAddr().String()
	if code, body := getScript(t, baseA, mac); code != http.StatusOK || !strings.Contains(body, "bcd.token="+token) {
		t.Fatalf("holder: %d %q", code, body)
	}
	if code, _ := getScript(t, baseB, mac); code != http.StatusServiceUnavailable {
		t.Fatalf("standby answered %d, want 503", code)
	}
	if !a.HoldsBootLease() || b.HoldsBootLease() {
		t.Fatalf("holds: a=%t b=%t", a.HoldsBootLease(), b.HoldsBootLease())
	}
	waitStatus(t, env, a.ref, func(s gateway.Status) bool { return s.HoldsBootLease })

	// Kill the holder; the machine keeps asking whichever agent answers.
	a.stop(t)
	killed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*ttl)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if code, body := getScript(t, baseB, mac); code == http.StatusOK && strings.Contains(body, "bcd.token="+token) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the standby did not take over within %s", 3*ttl)
		case <-tick.C:
		}
	}
	took := time.Since(killed)
	t.Logf("failover: the standby served /boot.ipxe %.2f s after the holder died (lease TTL %s, renewal every %s)", took.Seconds(), ttl, ttl/3)
	if took > 10*time.Second {
		t.Errorf("failover took %s, want < 10 s", took)
	}
	if lease.Holder(testSite) != "a2" {
		t.Errorf("holder %q, want a2", lease.Holder(testSite))
	}
	waitStatus(t, env, b.ref, func(s gateway.Status) bool { return s.HoldsBootLease })
}

// waitHolder waits until agent holds the site's lease.
func waitHolder(t *testing.T, l *site.MemoryLease, agent string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Holder(testSite) != agent {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not take the lease (holder %q)", agent, l.Holder(testSite))
		}
		time.Sleep(10 * time.Millisecond) // poll with a deadline: the lease has no change signal
	}
}
