package site_test

import (
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/site"
)

// A rotation of the agent CA reaches the machines the site agent boots: once the agent holds
// the next CA (the gateway's heartbeat answers name it, the agent renews and keeps the bundle),
// the ramdisk entries it builds pass the bundle as bcd.ca, so a ramdisk booted after the
// rotation's activation trusts the gateway's new certificate. No restart of the agent.
func TestRamdiskEntriesFollowTheAgentCA(t *testing.T) {
	env := startGateway(t)
	log := logger(t, &syncBuffer{})
	dir := t.TempDir()
	ag := startAgent(t, agentConfig(t, env, "a1", dir, log), "a1")
	waitHolds(t, ag)
	base := "http://" + ag.HTTPAddr().String()
	caOf := func(script string) string {
		m := regexp.MustCompile(`bcd\.ca=([A-Za-z0-9_-]+)`).FindStringSubmatch(script)
		if m == nil {
			t.Fatalf("no bcd.ca in the script %q", script)
		}
		b, err := base64.RawURLEncoding.DecodeString(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	prepare := func(id, mac string) string {
		t.Helper()
		token, _, _ := pki.NewToken(pki.DiscoveryTokenPrefix)
		if u := do(t, env, ag, id, site.KindPrepareRamdisk, "n1", map[string]any{"nodeId": "n1", "macs": []string{mac}, "token": token}); u.State != gateway.StateSucceeded {
			t.Fatalf("prepareRamdisk: %s %q", u.State, u.Error)
		}
		code, body := getScript(t, base, mac)
		if code != http.StatusOK {
			t.Fatalf("script: %d %q", code, body)
		}
		return caOf(body)
	}
	if got, want := prepare("prep-1", "52:54:00:cc:00:01"), string(env.CA.CertPEM()); got != want {
		t.Fatalf("before the rotation the entry carries %q, want the CA %q", got, want)
	}

	next, err := pki.CreateCA("next agent CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := env.CA.SetRotation(env.CA, next, nil); err != nil {
		t.Fatal(err)
	}
	bundle := string(env.CA.CertPEM())
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(dir, agentlink.CAFile))
		if string(b) == bundle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not take the rotation's bundle: it holds %q", b)
		}
		time.Sleep(20 * time.Millisecond) // poll with a deadline: the file is the agent's
	}
	if got := prepare("prep-2", "52:54:00:cc:00:02"); got != bundle {
		t.Fatalf("after the rotation the entry carries %q, want the bundle %q", got, bundle)
	}
}
