package site_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/lab/vbmc"
	"bcd/internal/pki"
	"bcd/internal/site"
)

const (
	bmcUser = "admin"
	bmcPass = "S3cret-Pa55-never"
)

// TestAgentEndToEnd drives a real site agent through a real TLS gateway (fake queue) against
// in-process virtual BMCs (Redfish over TLS with a pinned fingerprint, IPMI over UDP), then
// through the boot commands and the HTTP boot handler; the BMC password must never appear in
// a log line, a command error or a result.
func TestAgentEndToEnd(t *testing.T) {
	env := startGateway(t)
	logs := &syncBuffer{}
	log := logger(t, logs)
	dir := t.TempDir()
	cfg := agentConfig(t, env, "a1", dir, log)
	power := &powerReports{last: map[string]bmc.PowerState{}, ch: make(chan struct{}, 1)}
	cfg.PowerReporter, cfg.Poll = power, site.PollConfig{Interval: 100 * time.Millisecond}
	ag := startAgent(t, cfg, "a1")
	waitHolds(t, ag)
	cert := ag.certDER(t)

	rfMachine, ipmiMachine := vbmc.NewFakeMachine(), vbmc.NewFakeMachine()
	rfURL, fp := redfishBMC(t, rfMachine, bmcUser, bmcPass, []string{"52:54:00:aa:00:01"}, log)
	ipmiAddr := ipmiBMC(t, ipmiMachine, bmcUser, bmcPass, log)
	rfRef := map[string]any{"driver": "redfish", "address": rfURL, "usernameRef": "secret://u", "passwordRef": "secret://p", "fingerprintSha256": fp}
	ipmiRef := map[string]any{"driver": "ipmi", "address": ipmiAddr, "usernameRef": "secret://u", "passwordRef": "secret://p"}
	creds := credentials(t, cert, bmcUser, bmcPass)
	bmcArgs := func(ref map[string]any, kv ...string) map[string]any {
		a := map[string]any{"nodeId": "n1", "bmc": ref, "credentials": creds}
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i]] = kv[i+1]
		}
		return a
	}

	type check func(t *testing.T, result map[string]any)
	wantField := func(k string, v any) check {
		return func(t *testing.T, r map[string]any) {
			t.Helper()
			if r[k] != v {
				t.Errorf("result %s = %v, want %v (result %v)", k, r[k], v, r)
			}
		}
	}
	wantJSON := func(k, want string) check {
		return func(t *testing.T, r map[string]any) {
			t.Helper()
			if got, _ := json.Marshal(r[k]); string(got) != want {
				t.Errorf("result %s = %s, want %s", k, got, want)
			}
		}
	}
	// biosArgs is bmcArgs with values of any type.
	biosArgs := func(ref map[string]any, kv ...any) map[string]any {
		a := bmcArgs(ref)
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i].(string)] = kv[i+1]
		}
		return a
	}
	wantFirmware := func(want string) check {
		return func(t *testing.T, r map[string]any) {
			t.Helper()
			if got, _ := json.Marshal(r["firmware"]); string(got) != want {
				t.Errorf("firmware = %s, want %s", got, want)
			}
		}
	}
	steps := []struct {
		name    string
		kind    string
		args    map[string]any
		wantErr string // substring of the command error; "" means it succeeds
		checks  []check
		machine func() vbmc.FakeState
		want    vbmc.FakeState
	}{
		{name: "redfish power query", kind: site.KindBMCQuery, args: bmcArgs(rfRef, "query", "power"),
			checks: []check{wantField("power", "off")}},
		{name: "redfish power on", kind: site.KindBMCPower, args: bmcArgs(rfRef, "action", "on"),
			checks: []check{wantField("power", "on")}, machine: rfMachine.State, want: vbmc.FakeState{On: true, Boot: "pxe"}},
		{name: "redfish boot disk persistent", kind: site.KindBMCBoot, args: bmcArgs(rfRef, "device", "disk", "persistent", "true", "mode", "uefi"),
			checks: []check{wantField("device", "disk"), wantField("persistent", true)}, machine: rfMachine.State, want: vbmc.FakeState{On: true, Boot: "disk"}},
		{name: "redfish inventory", kind: site.KindBMCQuery, args: bmcArgs(rfRef, "query", "inventory"),
			checks: []check{wantField("systemUuid", "11111111-2222-3333-4444-555555555555"), wantField("serialNumber", "SN-1"), wantField("power", "on"),
				func(t *testing.T, r map[string]any) {
					if macs, _ := r["macs"].([]any); len(macs) != 1 || macs[0] != "52:54:00:aa:00:01" {
						t.Errorf("macs = %v", r["macs"])
					}
				}}},
		{name: "redfish firmware", kind: site.KindBMCQuery, args: bmcArgs(rfRef, "query", "firmware"),
			checks: []check{wantFirmware(`[{"id":"BMC","name":"BMC","version":"bcd-vbmc-1"}]`)}},
		{name: "redfish bios write", kind: site.KindBMCBIOS, args: biosArgs(rfRef, "attributes", map[string]string{"ProcVirtualization": "Disabled", "ProcCoreDisable": "2", "EmbNicPxe": "true"}),
			checks: []check{wantJSON("changed", `["ProcCoreDisable","ProcVirtualization"]`), wantField("pending", true)}},
		{name: "redfish bios pending before the reset", kind: site.KindBMCQuery, args: biosArgs(rfRef, "query", "bios", "names", []string{"ProcVirtualization", "ProcCoreDisable", "EmbNicPxe", "NoSuchKnob"}),
			checks: []check{wantJSON("attributes", `{"EmbNicPxe":"true","ProcCoreDisable":"0","ProcVirtualization":"Enabled"}`)}},
		{name: "redfish power cycle applies the bios settings", kind: site.KindBMCPower, args: bmcArgs(rfRef, "action", "cycle"),
			checks: []check{wantField("power", "on")}},
		{name: "redfish bios after the reset", kind: site.KindBMCQuery, args: biosArgs(rfRef, "query", "bios", "names", []string{"ProcVirtualization", "ProcCoreDisable", "EmbNicPxe"}),
			checks: []check{wantJSON("attributes", `{"EmbNicPxe":"true","ProcCoreDisable":"2","ProcVirtualization":"Disabled"}`)}},
		{name: "redfish bios in place writes nothing", kind: site.KindBMCBIOS, args: biosArgs(rfRef, "attributes", map[string]string{"ProcVirtualization": "Disabled"}),
			checks: []check{wantJSON("changed", `[]`), wantField("pending", false)}},
		{name: "redfish bios unknown attribute", kind: site.KindBMCBIOS, args: biosArgs(rfRef, "attributes", map[string]string{"NoSuchKnob": "On"}),
			wantErr: "does not report BIOS attribute(s) NoSuchKnob"},
		{name: "ipmi bios", kind: site.KindBMCBIOS, args: biosArgs(ipmiRef, "attributes", map[string]string{"ProcVirtualization": "Disabled"}),
			wantErr: "the driver cannot change BIOS settings"},
		{name: "bios without attributes", kind: site.KindBMCBIOS, args: bmcArgs(rfRef),
			wantErr: "attributes: 0 BIOS settings"},
		{name: "bios query without names", kind: site.KindBMCQuery, args: bmcArgs(rfRef, "query", "bios"),
			wantErr: "names: 0 BIOS attributes"},
		{name: "unknown query", kind: site.KindBMCQuery, args: bmcArgs(rfRef, "query", "sensors"),
			wantErr: `query "sensors": accepted are power, inventory, firmware, bios`},
		{name: "redfish power off", kind: site.KindBMCPower, args: bmcArgs(rfRef, "action", "off"),
			checks: []check{wantField("power", "off")}, machine: rfMachine.State, want: vbmc.FakeState{On: false, Boot: "disk"}},
		{name: "ipmi power on", kind: site.KindBMCPower, args: bmcArgs(ipmiRef, "action", "on"),
			checks: []check{wantField("power", "on")}, machine: ipmiMachine.State, want: vbmc.FakeState{On: true, Boot: "pxe"}},
		{name: "ipmi boot disk", kind: site.KindBMCBoot, args: bmcArgs(ipmiRef, "device", "disk"),
			checks: []check{wantField("device", "disk"), wantField("persistent", false)}},
		{name: "ipmi power query", kind: site.KindBMCQuery, args: bmcArgs(ipmiRef, "query", "power"),
			checks: []check{wantField("power", "on")}},
		{name: "ipmi inventory", kind: site.KindBMCQuery, args: bmcArgs(ipmiRef, "query", "inventory"),
			checks: []check{wantField("systemUuid", "66666666-7777-8888-9999-000000000000")}},
		{name: "ipmi firmware", kind: site.KindBMCQuery, args: bmcArgs(ipmiRef, "query", "firmware"),
			checks: []check{wantFirmware(`[{"id":"BMC","name":"BMC","version":"1.00"}]`)}},
		{name: "ipmi power cycle", kind: site.KindBMCPower, args: bmcArgs(ipmiRef, "action", "cycle"),
			checks: []check{wantField("power", "on")}},
		{name: "unknown driver", kind: site.KindBMCQuery, args: bmcArgs(map[string]any{"driver": "wsman", "address": "10.0.0.9"}, "query", "power"),
			wantErr: `unknown BMC driver "wsman": this agent has ipmi, redfish`},
		{name: "wrong password names the driver tried", kind: site.KindBMCQuery,
			args:    map[string]any{"nodeId": "n1", "bmc": rfRef, "credentials": credentials(t, cert, bmcUser, "wrong-"+bmcPass), "query": "power"},
			wantErr: "driver redfish at " + rfURL},
		{name: "ipmi wrong password", kind: site.KindBMCPower,
			args:    map[string]any{"nodeId": "n1", "bmc": ipmiRef, "credentials": credentials(t, cert, bmcUser, "x"+bmcPass), "action": "off"},
			wantErr: "driver ipmi at " + ipmiAddr},
		{name: "credentials for another agent", kind: site.KindBMCQuery,
			args:    map[string]any{"nodeId": "n1", "bmc": rfRef, "credentials": credentials(t, otherAgentCert(t, env), bmcUser, bmcPass), "query": "power"},
			wantErr: "decrypting BMC credentials"},
		{name: "bad power action", kind: site.KindBMCPower, args: bmcArgs(rfRef, "action", "explode"),
			wantErr: "unknown power action"},
		{name: "unknown kind", kind: "disk.wipe", args: map[string]any{"nodeId": "n1"},
			wantErr: `command kind "disk.wipe" is not run by site agents`},
	}
	for i, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			u := do(t, env, ag, "c"+string(rune('a'+i)), s.kind, "n1", s.args)
			if s.wantErr != "" {
				if u.State != gateway.StateFailed || !strings.Contains(u.Error, s.wantErr) {
					t.Fatalf("state %s, error %q; want failed with %q", u.State, u.Error, s.wantErr)
				}
				return
			}
			if u.State != gateway.StateSucceeded {
				t.Fatalf("state %s, error %q", u.State, u.Error)
			}
			var r map[string]any
			if err := json.Unmarshal(u.Result, &r); err != nil {
				t.Fatalf("result %q: %v", u.Result, err)
			}
			for _, c := range s.checks {
				c(t, r)
			}
			if s.machine != nil {
				if got := s.machine(); got.On != s.want.On || got.Boot != s.want.Boot {
					t.Errorf("machine %+v, want %+v", got, s.want)
				}
			}
		})
	}
	if n := ipmiMachine.Calls("PowerOff") + ipmiMachine.Calls("PowerOn"); n < 3 {
		t.Errorf("ipmi machine saw %d power calls, want on + cycle (off, on)", n)
	}

	// Power polling: n1's last successful BMC command went to the IPMI BMC; a machine turned
	// off behind the agent's back is reported.
	power.waitFor(t, "n1", bmc.PowerOn)
	ipmiMachine.SetOn(false)
	power.waitFor(t, "n1", bmc.PowerOff)

	// Boot entries.
	const mac = "52:54:00:aa:00:01"
	token, _, err := pki.NewToken(pki.DiscoveryTokenPrefix)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ag.HTTPAddr().String()
	if code, body := getScript(t, base, mac); code != http.StatusOK || !strings.Contains(body, "no boot entry") {
		t.Fatalf("before any entry: %d %q", code, body)
	}
	waitStatus(t, env, ag.ref, func(s gateway.Status) bool {
		return s.HoldsBootLease && slices.ContainsFunc(s.Discovered, func(d gateway.Discovered) bool { return d.MAC == mac })
	})
	u := do(t, env, ag, "boot1", site.KindPrepareRamdisk, "n1", map[string]any{"nodeId": "n1", "macs": []string{strings.ToUpper(mac)}, "productUuid": "", "token": token})
	if u.State != gateway.StateSucceeded || string(u.Result) != "{}" {
		t.Fatalf("prepareRamdisk: %s %q %s", u.State, u.Error, u.Result)
	}
	code, body := getScript(t, base, mac)
	for _, want := range []string{"bcd.token=" + token, "bcd.gateway=" + env.URL, "initrd=initrd.img", "/artifacts/"} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("script after prepareRamdisk: %d, lacks %q:\n%s", code, want, body)
		}
	}
	if strings.Contains(logs.String(), token) {
		t.Error("the discovery token appears in the logs")
	}
	// The kernel the script names is served from the verified cache.
	kernelURL := strings.Fields(body[strings.Index(body, "kernel --name"):])[3]
	if resp, err := http.Get(kernelURL); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %v", kernelURL, resp, err)
	} else {
		resp.Body.Close()
	}
	waitStatus(t, env, ag.ref, func(s gateway.Status) bool { return len(s.Discovered) == 0 })

	// The instance entry boots the local disk and the metadata endpoint answers the node.
	itoken, _, _ := pki.NewToken(pki.InstanceTokenPrefix)
	u = do(t, env, ag, "boot2", site.KindPrepareInst, "n1", map[string]any{"nodeId": "n1", "macs": []string{mac}, "token": itoken})
	if u.State != gateway.StateSucceeded {
		t.Fatalf("prepareInstance: %s %q", u.State, u.Error)
	}
	if code, body := getScript(t, base, mac); code != http.StatusOK || !strings.Contains(body, "exit") || strings.Contains(body, "kernel") {
		t.Fatalf("script after prepareInstance: %d %q", code, body)
	}
	resp, err := http.Get(base + "/metadata")
	if err != nil {
		t.Fatal(err)
	}
	var md map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&md); err != nil || md["nodeId"] != "n1" || md["instanceToken"] != itoken || md["gateway"] != env.URL ||
		!strings.HasPrefix(md["ca"], "-----BEGIN CERTIFICATE-----") {
		t.Fatalf("metadata %v (%v)", md, err)
	}
	resp.Body.Close()

	// A restarted agent (same data dir, no token) serves the entries again.
	ag.stop(t)
	cfg = agentConfig(t, env, "a1", dir, log)
	cfg.JoinToken = ""
	ag2 := startAgent(t, cfg, "a1")
	waitHolds(t, ag2)
	base2 := "http://" + ag2.HTTPAddr().String()
	if code, body := getScript(t, base2, mac); code != http.StatusOK || !strings.Contains(body, "exit") {
		t.Fatalf("after restart: %d %q", code, body)
	}

	// cleanUp: no boot.
	u = do(t, env, ag2, "boot3", site.KindCleanUp, "n1", map[string]any{"nodeId": "n1", "macs": []string{mac}})
	if u.State != gateway.StateSucceeded {
		t.Fatalf("cleanUp: %s %q", u.State, u.Error)
	}
	if code, body := getScript(t, base2, mac); code != http.StatusOK || !strings.Contains(body, "no boot entry") {
		t.Fatalf("after cleanUp: %d %q", code, body)
	}

	// The password never leaves the agent in clear.
	if strings.Contains(logs.String(), bmcPass) {
		t.Error("the BMC password appears in the logs")
	}
	for _, id := range []string{"ca", "cb", "cc", "cd", "ce", "cf", "cg", "ch", "ci", "cj", "ck", "cl", "cm", "cn", "co", "cp"} {
		e, _ := env.Queue.Get(id)
		if strings.Contains(e.Final.Error, bmcPass) || strings.Contains(string(e.Final.Result), bmcPass) {
			t.Errorf("command %s: the BMC password appears in its error or result: %q", id, e.Final.Error)
		}
	}
}

// powerReports is the PowerReporter of the test.
type powerReports struct {
	mu   sync.Mutex
	last map[string]bmc.PowerState
	ch   chan struct{}
}

func (p *powerReports) ReportPower(_ context.Context, r site.PowerReading) error {
	if r.Err != nil {
		return nil
	}
	p.mu.Lock()
	p.last[r.NodeID] = r.Power
	p.mu.Unlock()
	select {
	case p.ch <- struct{}{}:
	default:
	}
	return nil
}

func (p *powerReports) waitFor(t *testing.T, node string, want bmc.PowerState) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		p.mu.Lock()
		got := p.last[node]
		p.mu.Unlock()
		if got == want {
			return
		}
		select {
		case <-p.ch:
		case <-deadline:
			t.Fatalf("power of %s: last report %q, want %q", node, got, want)
		}
	}
}

// otherAgentCert joins a second identity only to get a certificate that is not the agent's.
func otherAgentCert(t *testing.T, env *gatewayEnv) []byte {
	t.Helper()
	key, csr, err := pki.NewKeyAndCSR("other")
	if err != nil {
		t.Fatal(err)
	}
	_ = key
	der, err := env.CA.IssueSiteAgent(csr, testSite, "other", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// waitStatus waits until the agent's last status report satisfies ok.
func waitStatus(t *testing.T, env *gatewayEnv, ref gateway.AgentRef, ok func(gateway.Status) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := gatewaytest.AgentKey(ref)
	for {
		n := env.Queue.Counts().Statuses[key]
		if st := env.Queue.Statuses(ref); len(st) > 0 && ok(st[len(st)-1]) {
			return
		}
		if err := env.Queue.WaitFor(ctx, func(c gatewaytestCounts) bool { return c.Statuses[key] > n }); err != nil {
			t.Fatalf("status: %v; reports %+v", err, env.Queue.Statuses(ref))
		}
	}
}
