package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
)

// TestNodeGetShowsItsAddresses: the DHCP leases the site's boot-lease holder reported for a
// node's MACs reach `bcd node get` (table and JSON) through the API; another node's lease, an
// expired one and one at another site do not.
func TestNodeGetShowsItsAddresses(t *testing.T) {
	ctx := context.Background()
	srv := newServer(t)
	env := map[string]string{"BCD_SERVER": srv.URL(), "BCD_TOKEN": srv.FirstAdminToken(), "BCD_BMC_PASSWORD": "pw"}
	if code, _, errs := run(t, env, "node", "enroll", "n1", "--bmc-address", "https://10.0.0.2", "--bmc-username", "root", "--mac", "52:54:00:00:00:aa", "--mac", "52:54:00:00:00:ab"); code != 0 {
		t.Fatalf("enroll: %s", errs)
	}
	if code, out, errs := run(t, env, "node", "get", "n1"); code != 0 || !strings.Contains(out, "addresses") {
		t.Fatalf("get before any lease: %d %q %q", code, out, errs)
	}
	st := srv.Service().Store()
	n, err := st.Node(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().Add(time.Hour).UnixMicro()
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.PutDHCPLeases(ctx, n.SiteID, []store.DHCPLease{
			{MAC: "52:54:00:00:00:aa", IP: "10.0.0.30", Expires: hour},
			{MAC: "52:54:00:00:00:ab", IP: "10.0.0.31", Expires: time.Now().Add(-time.Minute).UnixMicro()}, // over
			{MAC: "52:54:00:00:00:ff", IP: "10.0.0.32", Expires: hour},                                     // another machine
		}); err != nil {
			return err
		}
		return tx.PutDHCPLeases(ctx, "another-site", []store.DHCPLease{{MAC: "52:54:00:00:00:ab", IP: "10.9.0.31", Expires: hour}})
	}); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run(t, env, "node", "get", "n1")
	if code != 0 || !strings.Contains(out, "10.0.0.30 (52:54:00:00:00:aa, leased until ") || strings.Contains(out, "10.0.0.31") ||
		strings.Contains(out, "10.0.0.32") || strings.Contains(out, "10.9.0.31") {
		t.Fatalf("get: %d %q %q", code, out, errs)
	}
	code, out, errs = run(t, env, "-o", "json", "node", "get", "n1")
	var resp struct {
		Node struct {
			Addresses []struct{ Mac, Ip, ExpiresAt string } `json:"addresses"`
		} `json:"node"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &resp) != nil || len(resp.Node.Addresses) != 1 || resp.Node.Addresses[0].Ip != "10.0.0.30" {
		t.Fatalf("get -o json: %d %q %q", code, out, errs)
	}
	if _, err := time.Parse(time.RFC3339, resp.Node.Addresses[0].ExpiresAt); err != nil {
		t.Fatalf("expiresAt %q: %v", resp.Node.Addresses[0].ExpiresAt, err)
	}
}

// TestDoctorShowsBootServices: bcd doctor names each site agent's DHCP mode and boot binding
// and which one holds the boot lease, and warns of a connected agent that serves boot scripts
// to whoever asks (binding none).
func TestDoctorShowsBootServices(t *testing.T) {
	ctx := context.Background()
	srv := newServer(t)
	env := map[string]string{"BCD_SERVER": srv.URL(), "BCD_TOKEN": srv.FirstAdminToken()}
	st := srv.Service().Store()
	sites, err := st.Sites(ctx, "")
	if err != nil || len(sites) == 0 {
		t.Fatalf("sites %v %v", sites, err)
	}
	site := sites[0].ID
	if err := st.Write(ctx, func(tx *store.Tx) error {
		for _, a := range []store.Agent{{ID: "agent-a", Kind: "site", SiteID: site, Connected: true, ConnID: "c1"}, {ID: "agent-b", Kind: "site", SiteID: site, Connected: true, ConnID: "c2"}} {
			if err := tx.UpsertAgent(ctx, a); err != nil {
				return err
			}
		}
		// Commands no agent took yet: two for the site agents, one for a node's ramdisk.
		for _, on := range []string{"site", "site", "ramdisk"} {
			if err := tx.InsertCommand(ctx, &store.Command{SiteID: site, NodeID: "n-" + on, Kind: "bmc.power", Subject: "n", Args: "{}", RunsOn: on}); err != nil {
				return err
			}
		}
		if err := tx.SetAgentBootServices(ctx, "agent-a", "full", "lease"); err != nil {
			return err
		}
		if err := tx.SetAgentBootServices(ctx, "agent-b", "off", "none"); err != nil {
			return err
		}
		_, _, _, err := tx.AcquireLease(ctx, site, "agent-a", time.Minute)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// agent-a reports its artifact cache through the gateway's status path; a malformed count is
	// taken as 0, and an agent that reports no cache facts (agent-b, an older agent) shows none.
	gw := srv.Engine().Gateway()
	for _, facts := range []map[string]string{
		{"dhcp": "full", "bootBinding": "lease", "cacheArtifacts": "45", "cacheBytes": "13421772800", "cacheBoundBytes": "21474836480",
			"cacheEvictions": "3", "cacheEvictedBytes": "-5"},
		{"dhcp": "full", "bootBinding": "lease", "cacheArtifacts": "45", "cacheBytes": "13421772800", "cacheBoundBytes": "21474836480",
			"cacheEvictions": "3", "cacheEvictedBytes": "4294967296"},
	} {
		if err := gw.Status(ctx, gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: site, AgentID: "agent-a"}, gateway.Status{Facts: facts}); err != nil {
			t.Fatal(err)
		}
	}
	if err := gw.Status(ctx, gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: site, AgentID: "agent-b"}, gateway.Status{Facts: map[string]string{"dhcp": "off", "bootBinding": "none"}}); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run(t, env, "doctor")
	if code != 0 {
		t.Fatalf("doctor: %d %q", code, errs)
	}
	lineOf := func(agent string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), agent+" ") {
				return l
			}
		}
		return ""
	}
	if a := lineOf("agent-a"); !strings.Contains(a, "dhcp full, binding lease, holds the boot lease, cache 12.5 GiB of 20.0 GiB, 45 artifacts, 3 evicted (4.0 GiB)") {
		t.Errorf("agent-a: %q\n%s", a, out)
	}
	if b := lineOf("agent-b"); !strings.Contains(b, "dhcp off, binding none") || strings.Contains(b, "holds") || strings.Contains(b, "cache") {
		t.Errorf("agent-b: %q\n%s", b, out)
	}
	queues := regexp.MustCompile(`commands waiting for an agent: 3\n  ` + sites[0].Name + `\s+for the site agents\s+2\s+oldest queued 20\d\d-\S+\s+waiting [0-9.]+(ms|s)\n  ` +
		sites[0].Name + `\s+for the nodes' ramdisks\s+1\s+oldest queued 20\d\d-\S+\s+waiting [0-9.]+(ms|s)\n`)
	if !queues.MatchString(out) {
		t.Errorf("the commands waiting for an agent, the site agents' first:\n%s", out)
	}
	if !strings.Contains(out, "warning: agent-b") || strings.Contains(out, "warning: agent-a") {
		t.Errorf("warnings:\n%s", out)
	}
}
