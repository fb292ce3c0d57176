package site_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"bcd/internal/gateway"
	"bcd/internal/lab/vbmc"
	"bcd/internal/site"
)

// TestAgentPrunesCache: a site agent keeps its artifact cache within --cache-max. An ISO a
// BMC's virtual media reads and one a sanboot entry boots stay; an ISO whose sanboot entry an
// eject removed is evicted once a download takes the cache over its bound, the eviction is
// logged, and the status reports carry the cache's new counts.
func TestAgentPrunesCache(t *testing.T) {
	env := startGateway(t)
	logs := &syncBuffer{}
	log := logger(t, logs)
	cfg := agentConfig(t, env, "a1", t.TempDir(), log)
	cfg.CacheBound = 2500
	ag := startAgent(t, cfg, "a1")
	waitHolds(t, ag)

	isos := map[string][]byte{}
	sums := map[string]string{}
	for _, n := range []string{"mounted", "ejected", "booted"} {
		isos["/"+n+".iso"] = bytes.Repeat([]byte(n[:1]), 1000)
		s := sha256.Sum256(isos["/"+n+".iso"])
		sums[n] = hex.EncodeToString(s[:])
	}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(isos[r.URL.Path]) }))
	defer origin.Close()

	rfMachine, ipmiMachine := vbmc.NewFakeMachine(), vbmc.NewFakeMachine()
	rfURL, fp := redfishBMC(t, rfMachine, bmcUser, bmcPass, []string{"52:54:00:bb:00:01"}, log)
	ipmiAddr := ipmiBMC(t, ipmiMachine, bmcUser, bmcPass, log)
	rfRef := map[string]any{"driver": "redfish", "address": rfURL, "usernameRef": "secret://u", "passwordRef": "secret://p", "fingerprintSha256": fp}
	ipmiRef := map[string]any{"driver": "ipmi", "address": ipmiAddr, "usernameRef": "secret://u", "passwordRef": "secret://p"}
	creds := credentials(t, ag.certDER(t), bmcUser, bmcPass)
	n := 0
	media := func(node string, ref map[string]any, mac string, kv ...string) {
		t.Helper()
		a := map[string]any{"nodeId": node, "bmc": ref, "credentials": creds, "macs": []string{mac}}
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i]] = kv[i+1]
		}
		n++
		if u := do(t, env, ag, "p"+string(rune('a'+n)), site.KindBMCMedia, node, a); u.State != gateway.StateSucceeded {
			t.Fatalf("bmc.media %v on %s: %s", kv, node, u.Error)
		}
	}
	insert := func(name string) []string {
		return []string{"action", "insert", "image", name, "url", origin.URL + "/" + name + ".iso", "sha256", sums[name]}
	}

	media("n1", rfRef, "52:54:00:bb:00:01", insert("mounted")...)   // virtual media: the BMC reads it
	media("n2", ipmiRef, "52:54:00:bb:00:02", insert("ejected")...) // a sanboot entry…
	media("n2", ipmiRef, "52:54:00:bb:00:02", "action", "eject")    // …removed: nothing uses the ISO
	media("n3", ipmiRef, "52:54:00:bb:00:03", insert("booted")...)  // 3000 bytes > 2500

	waitStatus(t, env, ag.ref, func(s gateway.Status) bool {
		return s.Facts["cacheEvictions"] == "1" && s.Facts["cacheArtifacts"] == "2" && s.Facts["cacheBytes"] == "2000" &&
			s.Facts["cacheBoundBytes"] == "2500" && s.Facts["cacheEvictedBytes"] == "1000"
	})
	if !strings.Contains(logs.String(), "artifact evicted from the cache") || !strings.Contains(logs.String(), "sha256="+sums["ejected"]) {
		t.Fatalf("no eviction of the ejected ISO in the logs")
	}
	for name, want := range map[string]int{"mounted": http.StatusOK, "booted": http.StatusOK, "ejected": http.StatusNotFound} {
		resp, err := http.Get(ag.BootURL() + "/artifacts/" + sums[name] + "/" + name + ".iso")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s.iso: HTTP %d, want %d", name, resp.StatusCode, want)
		}
	}
}
