package site_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"bcd/internal/gateway"
	"bcd/internal/lab/vbmc"
	"bcd/internal/site"
)

// TestMediaInsertEject: bmc.media puts a catalog ISO behind the BMC's virtual media (Redfish:
// the virtual BMC downloads it from the site cache, where it is served only once its sha256
// matched), or, for a driver without virtual media (IPMI), behind an iPXE sanboot entry; a
// boot from cd then boots from PXE; eject undoes either.
func TestMediaInsertEject(t *testing.T) {
	env := startGateway(t)
	logs := &syncBuffer{}
	log := logger(t, logs)
	ag := startAgent(t, agentConfig(t, env, "a1", t.TempDir(), log), "a1")
	waitHolds(t, ag)
	iso := []byte("CD001 a bootable rescue image")
	sum := sha256.Sum256(iso)
	sha := hex.EncodeToString(sum[:])
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(iso) }))
	defer origin.Close()

	rfMachine, ipmiMachine := vbmc.NewFakeMachine(), vbmc.NewFakeMachine()
	rfURL, fp := redfishBMC(t, rfMachine, bmcUser, bmcPass, []string{"52:54:00:aa:00:01"}, log)
	ipmiAddr := ipmiBMC(t, ipmiMachine, bmcUser, bmcPass, log)
	rfRef := map[string]any{"driver": "redfish", "address": rfURL, "usernameRef": "secret://u", "passwordRef": "secret://p", "fingerprintSha256": fp}
	ipmiRef := map[string]any{"driver": "ipmi", "address": ipmiAddr, "usernameRef": "secret://u", "passwordRef": "secret://p"}
	creds := credentials(t, ag.certDER(t), bmcUser, bmcPass)
	args := func(node string, ref map[string]any, mac string, kv ...string) map[string]any {
		a := map[string]any{"nodeId": node, "bmc": ref, "credentials": creds, "macs": []string{mac}}
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i]] = kv[i+1]
		}
		return a
	}
	insert := []string{"action", "insert", "image", "rescue", "url", origin.URL + "/rescue.iso", "sha256", sha}
	n := 0
	run := func(kind, node string, a map[string]any) (map[string]any, string) {
		t.Helper()
		n++
		u := do(t, env, ag, "m"+string(rune('a'+n)), kind, node, a)
		if u.State != gateway.StateSucceeded {
			return nil, u.Error
		}
		var r map[string]any
		if err := json.Unmarshal(u.Result, &r); err != nil {
			t.Fatal(err)
		}
		return r, ""
	}
	script := func(mac string) string {
		resp, err := http.Get(ag.BootURL() + "/boot.ipxe?mac=" + mac + "&uuid=&arch=x86_64")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// Redfish: virtual media, fed from the site cache.
	r, errMsg := run(site.KindBMCMedia, "n1", args("n1", rfRef, "52:54:00:aa:00:01", insert...))
	if errMsg != "" || r["via"] != site.MediaVirtual || !strings.HasPrefix(r["url"].(string), ag.BootURL()+"/artifacts/"+sha+"/") {
		t.Fatalf("redfish insert: %v %s", r, errMsg)
	}
	media := rfMachine.State().Media
	if got, err := os.ReadFile(media); err != nil || string(got) != string(iso) {
		t.Fatalf("the virtual BMC's CD holds %q (%v), want the ISO", got, err)
	}
	if r, errMsg = run(site.KindBMCBoot, "n1", args("n1", rfRef, "52:54:00:aa:00:01", "device", "cd")); errMsg != "" || r["device"] != "cd" || rfMachine.State().Boot != "cd" {
		t.Fatalf("redfish boot cd: %v %s, machine %+v", r, errMsg, rfMachine.State())
	}
	if r, errMsg = run(site.KindBMCMedia, "n1", args("n1", rfRef, "52:54:00:aa:00:01", "action", "eject")); errMsg != "" || rfMachine.State().Media != "" {
		t.Fatalf("redfish eject: %v %s, machine %+v", r, errMsg, rfMachine.State())
	}

	// IPMI has no virtual media: a sanboot entry of the cached ISO; cd means PXE.
	if r, errMsg = run(site.KindBMCMedia, "n2", args("n2", ipmiRef, "52:54:00:aa:00:02", insert...)); errMsg != "" || r["via"] != site.MediaSanboot {
		t.Fatalf("ipmi insert: %v %s", r, errMsg)
	}
	want := "sanboot --no-describe " + ag.BootURL() + "/artifacts/" + sha + "/rescue.iso"
	if s := script("52:54:00:aa:00:02"); !strings.Contains(s, want) {
		t.Fatalf("script of the ipmi machine lacks %q:\n%s", want, s)
	}
	if r, errMsg = run(site.KindBMCBoot, "n2", args("n2", ipmiRef, "52:54:00:aa:00:02", "device", "cd")); errMsg != "" || r["device"] != "pxe" || ipmiMachine.State().Boot != "pxe" {
		t.Fatalf("ipmi boot cd: %v %s, machine %+v", r, errMsg, ipmiMachine.State())
	}
	if r, errMsg = run(site.KindBMCMedia, "n2", args("n2", ipmiRef, "52:54:00:aa:00:02", "action", "eject")); errMsg != "" || r["via"] != site.MediaSanboot {
		t.Fatalf("ipmi eject: %v %s", r, errMsg)
	}
	if s := script("52:54:00:aa:00:02"); strings.Contains(s, "sanboot") {
		t.Fatalf("the sanboot entry outlived the eject:\n%s", s)
	}

	// Refusals.
	bad := args("n3", ipmiRef, "52:54:00:aa:00:03", insert...)
	bad["sha256"] = strings.Repeat("0", 64)
	if _, errMsg = run(site.KindBMCMedia, "n3", bad); !strings.Contains(errMsg, "caching the iso") {
		t.Errorf("an ISO whose digest does not match: %q", errMsg)
	}
	if s := script("52:54:00:aa:00:03"); strings.Contains(s, "sanboot") {
		t.Errorf("a sanboot entry was installed for an unverified ISO:\n%s", s)
	}
	if _, errMsg = run(site.KindBMCMedia, "n3", args("n3", ipmiRef, "52:54:00:aa:00:03", "action", "explode")); !strings.Contains(errMsg, "accepted are insert, eject") {
		t.Errorf("bad action: %q", errMsg)
	}
	if strings.Contains(logs.String(), bmcPass) {
		t.Error("the BMC password appears in the logs")
	}
}
