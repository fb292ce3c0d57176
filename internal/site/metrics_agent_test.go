package site_test

import (
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"bcd/internal/gateway"
	"bcd/internal/lab/vbmc"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/site"
)

// scrape reads the agent's /metrics: "name{l=v,…}" (labels sorted) → value; a histogram as its
// _count.
func scrape(t *testing.T, addr net.Addr) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(ls)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			n := name
			if h := m.GetHistogram(); h != nil {
				n, v = name+"_count", float64(h.GetSampleCount())
			}
			out[n+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// TestAgentMetrics runs a real agent against a real gateway with its metrics on loopback: a
// boot entry's artifacts are cached and one is streamed over boot HTTP, an IPMI BMC (the lab's
// virtual one) is queried, and /metrics says so; the metrics address closes with the agent.
func TestAgentMetrics(t *testing.T) {
	env := startGateway(t)
	log := logger(t, &syncBuffer{})
	cfg := agentConfig(t, env, "a1", t.TempDir(), log)
	cfg.MetricsListen = "127.0.0.1:0"
	ag := startAgent(t, cfg, "a1")
	waitHolds(t, ag)
	addr := ag.MetricsAddr()
	if addr == nil {
		t.Fatal("no metrics address")
	}
	before := scrape(t, addr)

	token, _, err := pki.NewToken(pki.DiscoveryTokenPrefix)
	if err != nil {
		t.Fatal(err)
	}
	u := do(t, env, ag, "boot1", site.KindPrepareRamdisk, "n1", map[string]any{"nodeId": "n1", "macs": []string{"52:54:00:aa:00:01"}, "token": token})
	if u.State != gateway.StateSucceeded {
		t.Fatalf("prepareRamdisk: %s %q", u.State, u.Error)
	}
	k := cfg.Ramdisk.Kernel
	resp, err := http.Get("http://" + ag.HTTPAddr().String() + netboot.ArtifactPath + k.SHA256 + "/" + k.Name)
	if err != nil {
		t.Fatal(err)
	}
	kernel, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the kernel: %d", resp.StatusCode)
	}
	machine := vbmc.NewFakeMachine()
	ipmiAddr := ipmiBMC(t, machine, bmcUser, bmcPass, log)
	u = do(t, env, ag, "q1", site.KindBMCQuery, "n1", map[string]any{"nodeId": "n1", "query": "power", "credentials": credentials(t, ag.certDER(t), bmcUser, bmcPass),
		"bmc": map[string]any{"driver": "ipmi", "address": ipmiAddr, "usernameRef": "secret://u", "passwordRef": "secret://p"}})
	if u.State != gateway.StateSucceeded {
		t.Fatalf("bmc.query: %s %q", u.State, u.Error)
	}

	after := scrape(t, addr)
	delta := func(k string) float64 { return after[k] - before[k] }
	for k, want := range map[string]float64{
		"bcd_site_commands_total{kind=boot.prepareRamdisk,result=ok}": 1,
		"bcd_site_commands_total{kind=bmc.query,result=ok}":           1,
		"bcd_site_http_requests_total{code=2xx,route=artifact}":       1,
		"bcd_site_http_sent_bytes_total{route=artifact}":              float64(len(kernel)),
		"bcd_site_cache_artifacts{}":                                  2, // kernel and initrd
	} {
		if got := delta(k); got != want {
			t.Errorf("%s moved by %v, want %v", k, got, want)
		}
	}
	// The power polling may read the BMC too, at any moment: at least the command's call.
	for _, k := range []string{"bcd_site_bmc_calls_total{driver=ipmi,op=get_power,result=ok}", "bcd_site_bmc_call_duration_seconds_count{driver=ipmi}"} {
		if delta(k) < 1 {
			t.Errorf("%s moved by %v, want 1 or more", k, delta(k))
		}
	}
	for k, want := range map[string]float64{"bcd_site_gateway_up{}": 1, "bcd_site_boot_lease_held{}": 1, "bcd_site_boot_entries{}": 1,
		"bcd_site_commands_in_flight{}": 0, "bcd_site_dhcp_requests_total{mode=off,type=discover}": 0} {
		if got, ok := after[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	for _, k := range []string{"bcd_site_gateway_sessions_total{}", "bcd_site_journal_bytes{}", "bcd_site_cache_bytes{}"} {
		if after[k] <= 0 {
			t.Errorf("%s = %v, want more than 0", k, after[k])
		}
	}
	if _, ok := after["go_goroutines{}"]; !ok {
		t.Error("no Go collector")
	}
	if _, ok := after["process_resident_memory_bytes{}"]; !ok {
		t.Error("no process collector")
	}

	ag.stop(t)
	if c, err := net.Dial("tcp", addr.String()); err == nil {
		c.Close()
		t.Error("the metrics address still accepts connections after the agent stopped")
	}
}
