package site_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"bcd/internal/gateway"
	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
	"bcd/internal/site"
)

// TestFirmwareUpdateThroughTheBMC: bmc.firmware installs a catalog firmware image through the
// real site agent and Redfish driver: the agent caches the image (served only once its sha256
// matched) and the virtual BMC fetches it from the agent's boot HTTP, runs its update task and
// stages the version, which runs after a power cycle; a machine on the wanted version installs
// nothing; an image whose digest does not match never reaches the BMC; IPMI cannot update.
func TestFirmwareUpdateThroughTheBMC(t *testing.T) {
	env := startGateway(t)
	logs := &syncBuffer{}
	log := logger(t, logs)
	ag := startAgent(t, agentConfig(t, env, "a1", t.TempDir(), log), "a1")
	waitHolds(t, ag)
	image := redfishbmc.FirmwareImage("BIOS", "2.0")
	sum := sha256.Sum256(image)
	sha := hex.EncodeToString(sum[:])
	var fetched atomic.Int32
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fetched.Add(1); w.Write(image) }))
	defer origin.Close()

	rfMachine, ipmiMachine := vbmc.NewFakeMachine(), vbmc.NewFakeMachine()
	rfMachine.SetOn(true)
	rfURL, fp := redfishBMC(t, rfMachine, bmcUser, bmcPass, nil, log, func(c *redfishbmc.Config) { c.BiosVersion = "1.0" })
	rfRef := map[string]any{"driver": "redfish", "address": rfURL, "usernameRef": "secret://u", "passwordRef": "secret://p", "fingerprintSha256": fp}
	ipmiRef := map[string]any{"driver": "ipmi", "address": ipmiBMC(t, ipmiMachine, bmcUser, bmcPass, log), "usernameRef": "secret://u", "passwordRef": "secret://p"}
	creds := credentials(t, ag.certDER(t), bmcUser, bmcPass)
	update := map[string]any{"component": "BIOS", "version": "2.0", "image": "bios-2", "url": origin.URL + "/bios-2.bin", "size": len(image), "sha256": sha}
	args := func(ref map[string]any, kv ...any) map[string]any {
		a := map[string]any{"nodeId": "n1", "bmc": ref, "credentials": creds}
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i].(string)] = kv[i+1]
		}
		return a
	}
	n := 0
	run := func(kind string, a map[string]any) (map[string]any, string) {
		t.Helper()
		n++
		u := do(t, env, ag, "f"+string(rune('a'+n)), kind, "n1", a)
		if u.State != gateway.StateSucceeded {
			return nil, u.Error
		}
		var r map[string]any
		if err := json.Unmarshal(u.Result, &r); err != nil {
			t.Fatal(err)
		}
		return r, ""
	}
	biosVersion := func() string {
		t.Helper()
		r, errMsg := run(site.KindBMCQuery, args(rfRef, "query", "firmware"))
		if errMsg != "" {
			t.Fatal(errMsg)
		}
		b, _ := json.Marshal(r["firmware"])
		var fw []struct{ ID, Version string }
		_ = json.Unmarshal(b, &fw)
		for _, f := range fw {
			if f.ID == "BIOS" {
				return f.Version
			}
		}
		return ""
	}

	r, errMsg := run(site.KindBMCFirmware, args(rfRef, "updates", []any{update}))
	if errMsg != "" || r["pending"] != true || len(r["updated"].([]any)) != 1 || r["updated"].([]any)[0] != "BIOS" {
		t.Fatalf("update: %v %s", r, errMsg)
	}
	if got := fetched.Load(); got != 1 {
		t.Errorf("the origin served the image %d times, want once (the BMC reads the site's cache)", got)
	}
	if v := biosVersion(); v != "1.0" {
		t.Fatalf("before the reset the BIOS runs %s, want 1.0 (staged)", v)
	}
	if _, errMsg := run(site.KindBMCPower, args(rfRef, "action", "cycle")); errMsg != "" {
		t.Fatal(errMsg)
	}
	if v := biosVersion(); v != "2.0" {
		t.Fatalf("after the reset the BIOS runs %s, want 2.0", v)
	}
	if r, errMsg := run(site.KindBMCFirmware, args(rfRef, "updates", []any{update})); errMsg != "" || r["pending"] != false || len(r["updated"].([]any)) != 0 {
		t.Fatalf("update of a machine on the version: %v %s", r, errMsg)
	}

	bad := map[string]any{}
	for k, v := range update {
		bad[k] = v
	}
	bad["version"], bad["sha256"] = "3.0", strings.Repeat("0", 64)
	for _, tc := range []struct {
		name string
		a    map[string]any
		want string
	}{
		{"digest mismatch", args(rfRef, "updates", []any{bad}), "caching the firmware image bios-2"},
		{"ipmi", args(ipmiRef, "updates", []any{update}), "the driver cannot update firmware"},
		{"no updates", args(rfRef), "updates: 0 firmware images"},
	} {
		if _, errMsg := run(site.KindBMCFirmware, tc.a); !strings.Contains(errMsg, tc.want) {
			t.Errorf("%s: %q, want it to say %q", tc.name, errMsg, tc.want)
		}
	}
	if v := biosVersion(); v != "2.0" {
		t.Errorf("after the refusals the BIOS runs %s, want 2.0", v)
	}
	if strings.Contains(logs.String(), bmcPass) {
		t.Error("the BMC password appears in the logs")
	}
}
