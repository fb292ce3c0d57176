package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// swapped writes a UUID in the other SMBIOS byte order (what some firmware hands iPXE).
func swapped(u string) string {
	_, b := engine.UUIDForms(u)
	return b
}

// TestMACLessNodeLearnsItsMAC: nodes enrolled by product UUID with no MAC (IPMI) are
// power-cycled into PXE; the MAC they boot with under their UUID (either byte order) becomes a
// candidate an operator confirms, or is bound at once in a pool that trusts its provisioning
// network; ambiguity, a MAC of another node and silence fail with their fault codes.
func TestMACLessNodeLearnsItsMAC(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := Start(ctx, st, Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond, MACWindow: 3 * time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		if _, err := h.Metal.CreatePool(ctx, h.Admin, "trusted", "default", store.PoolPolicy{HardwareProfile: "redfish", TrustProvisioningNetwork: true}); err != nil {
			t.Fatal(err)
		}
		// A normal node owns the MAC the "conflict" machine will boot with.
		owners, err := h.Enroll(ctx, "owner", 1)
		if err != nil {
			t.Fatal(err)
		}
		ownedMAC := h.Sim.Machine(owners[0]).MACs[0]
		// Another MAC booted under the "ambiguous" UUID within the last day.
		const ambiguousUUID = "44444444-1111-4222-8333-000000000004"
		site := engine.Agent{ID: "sim-site-1", Kind: "site", SiteID: h.SiteID}
		earlier := time.Now().Add(-time.Hour)
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{{MAC: "52:54:00:00:04:99", UUID: ambiguousUUID, FirstSeen: earlier, LastSeen: earlier}}); err != nil {
			t.Fatal(err)
		}

		type node struct{ name, pool, uuid, pxeUUID, mac, state, fault string }
		nodes := []node{
			{"confirmed", "default", "11111111-1111-4222-8333-000000000001", swapped("11111111-1111-4222-8333-000000000001"), "52:54:00:00:01:01", "ready", ""},
			{"trusted", "trusted", "22222222-1111-4222-8333-000000000002", "", "52:54:00:00:02:01", "ready", ""},
			{"conflict", "default", "33333333-1111-4222-8333-000000000003", "", ownedMAC, "failed", "MAC_CONFLICT"},
			{"ambiguous", "default", ambiguousUUID, "", "52:54:00:00:04:01", "failed", "MAC_AMBIGUOUS"},
			{"silent", "default", "55555555-1111-4222-8333-000000000005", "66666666-1111-4222-8333-000000000006", "52:54:00:00:05:01", "failed", "MAC_NOT_DISCOVERED"},
		}
		ids := map[string]string{}
		var all []string
		for _, n := range nodes {
			id, err := h.EnrollByUUID(ctx, n.name, n.pool, n.uuid, n.pxeUUID, n.mac)
			if err != nil {
				t.Fatal(err)
			}
			ids[n.name] = id
			all = append(all, id)
		}

		// The untrusted node waits with a pending candidate: no boot entry, no token.
		var cand store.MACCandidate
		deadline := time.Now().Add(30 * time.Second)
		for cand.State != store.CandidatePending {
			if time.Now().After(deadline) {
				t.Fatalf("no pending candidate for %s", ids["confirmed"])
			}
			cs, err := h.Store.MACCandidates(ctx, h.SiteID, store.CandidatePending)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.NodeID == ids["confirmed"] {
					cand = c
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cand.MAC != "52:54:00:00:01:01" {
			t.Fatalf("candidate %+v", cand)
		}
		m := h.Sim.Machine(ids["confirmed"])
		m.mu.Lock()
		entry, token := m.entry, m.token
		m.mu.Unlock()
		if entry || token != "" {
			t.Fatalf("an unconfirmed candidate got a boot entry (%v) or a token", entry)
		}
		if n, _ := h.Store.Node(ctx, ids["confirmed"], ""); n.State != "inspecting" || len(n.MACs) != 0 {
			t.Fatalf("before confirmation: %s macs %v", n.State, n.MACs)
		}
		for _, bad := range []struct{ node, mac, want string }{
			{ids["confirmed"], "52:54:00:00:01:02", "not the candidate"},
			{ids["confirmed"], "not-a-mac", "mac"},
			{ids["silent"], "52:54:00:00:05:01", "no MAC candidate"},
		} {
			if _, err := h.Metal.ConfirmMAC(ctx, h.Admin, bad.node, bad.mac, ""); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("confirm %s %s: %v, want an error saying %q", bad.node, bad.mac, err, bad.want)
			}
		}
		if _, err := h.Metal.ConfirmMAC(ctx, h.Admin, "confirmed", "52:54:00:00:01:01", "checked the rack label"); err != nil {
			t.Fatal(err)
		}

		got, err := h.WaitRest(ctx, all, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			g := got[ids[n.name]]
			if g.State != n.state || g.FaultCode != n.fault {
				t.Errorf("%s: %s %s (%s), want %s %s", n.name, g.State, g.FaultCode, g.FaultMsg, n.state, n.fault)
			}
			if n.state == "ready" && (len(g.MACs) != 1 || g.MACs[0] != n.mac) {
				t.Errorf("%s: MACs %v, want [%s]", n.name, g.MACs, n.mac)
			}
			if n.state == "failed" && len(g.MACs) != 0 {
				t.Errorf("%s: failed but bound %v", n.name, g.MACs)
			}
		}
		cs, err := h.Store.MACCandidates(ctx, h.SiteID, "")
		if err != nil {
			t.Fatal(err)
		}
		states := map[string]string{}
		for _, c := range cs {
			states[c.NodeID] = c.State + " " + c.MAC
		}
		if states[ids["confirmed"]] != "confirmed 52:54:00:00:01:01" || states[ids["trusted"]] != "bound 52:54:00:00:02:01" || len(states) != 2 {
			t.Errorf("candidates %v", states)
		}
	})
}

// TestAcceptanceFlow: machines a discovery-mode ramdisk reported are pending until an operator
// accepts one (enrolled with the operator's BMC credentials, its boot MAC and reported UUID,
// the pool's labels merged; then the whole chain to ready, the ramdisk's inventory matching)
// or rejects it; autoAccept (off by default) records the acceptance itself.
func TestAcceptanceFlow(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := Start(ctx, st, Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		if _, err := h.Metal.CreatePool(ctx, h.Admin, "gpu", "default", store.PoolPolicy{HardwareProfile: "redfish", Labels: map[string]string{"class": "gpu"}}); err != nil {
			t.Fatal(err)
		}
		site := engine.Agent{ID: "sim-site-1", Kind: "site", SiteID: h.SiteID}
		const (
			mac  = "52:54:00:aa:00:01"
			uuid = "77777777-1111-4222-8333-000000000007"
			no   = "52:54:00:aa:00:02"
			auto = "52:54:00:aa:00:03"
		)
		now := time.Now()
		report := func(m, u string) engine.Discovery {
			return engine.Discovery{MAC: m, UUID: swapped(u), Arch: "x86_64", FirstSeen: now, LastSeen: now,
				Inventory: `{"bootMac":"` + m + `","systemUuid":"` + u + `","macs":["` + m + `"],"disks":[{"name":"vda","sizeBytes":8589934592}]}`}
		}
		// A plain PXE sighting is discovered but not pending; a report makes it pending.
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{{MAC: "52:54:00:aa:00:09", UUID: uuid, FirstSeen: now, LastSeen: now},
			report(mac, uuid), report(no, "88888888-1111-4222-8333-000000000008"), {MAC: "52:54:00:aa:00:0a", Inventory: "not json"}}); err != nil {
			t.Fatal(err)
		}
		pendingMACs := func() map[string]string {
			ps, err := h.Metal.Pending(ctx, h.Admin, "default", 0)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]string{}
			for _, p := range ps {
				out[p.MAC] = p.Acceptance + "/" + p.DecidedBy
			}
			return out
		}
		if got := pendingMACs(); len(got) != 2 || got[mac] != "/" || got[no] != "/" {
			t.Fatalf("pending %v", got)
		}
		if err := h.Metal.RejectDiscovered(ctx, h.Admin, "default", no, "not ours"); err != nil {
			t.Fatal(err)
		}
		// The boot-lease holder is told of the rejection (its waiting ramdisk powers off).
		if g, err := h.Engine.BootLease(ctx, engine.Agent{ID: "site-x", Kind: "site", SiteID: h.SiteID}, engine.LeaseRequest{}); err != nil || !g.Held || len(g.Rejected) != 1 || g.Rejected[0] != no {
			t.Fatalf("lease grant's rejected MACs: %+v %v", g, err)
		}
		if _, err := h.Engine.BootLease(ctx, engine.Agent{ID: "site-x", Kind: "site", SiteID: h.SiteID}, engine.LeaseRequest{Release: true}); err != nil {
			t.Fatal(err)
		}
		bmc := metal.BMCInput{Address: "https://10.9.0.7", Username: "admin", Password: "sim-password"}
		if _, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: "52:54:00:aa:00:77", Pool: "gpu", Name: "x", BMC: bmc}); err == nil {
			t.Error("a MAC never seen was accepted")
		}
		if _, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: mac, Pool: "gpu", Name: "acc-1"}); err == nil || !strings.Contains(err.Error(), "bmc") {
			t.Errorf("accepted without BMC credentials: %v", err)
		}
		n, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: mac, Pool: "gpu", Name: "acc-1", BMC: bmc, Labels: map[string]string{"rack": "r9"}, Reason: "new rack"})
		if err != nil {
			t.Fatal(err)
		}
		if n.ProductUUID != uuid || len(n.MACs) != 1 || n.MACs[0] != mac || n.Labels["class"] != "gpu" || n.Labels["rack"] != "r9" {
			t.Fatalf("accepted node %+v", n)
		}
		h.Sim.Add(&Machine{NodeID: n.ID, UUID: uuid, MACs: []string{mac}})
		h.Engine.Nudge()
		got, err := h.WaitRest(ctx, []string{n.ID}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if g := got[n.ID]; g.State != "ready" {
			t.Fatalf("accepted node: %s %s %s", g.State, g.FaultCode, g.FaultMsg)
		}
		if _, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: mac, Pool: "gpu", Name: "acc-2", BMC: bmc}); err == nil {
			t.Error("a machine was accepted twice")
		}
		if err := h.Metal.RejectDiscovered(ctx, h.Admin, "default", mac, ""); err == nil {
			t.Error("an enrolled machine was rejected")
		}
		if d, err := h.Store.DiscoveryOf(ctx, h.SiteID, mac); err != nil || d.Acceptance != store.AcceptanceAccepted || d.NodeID != n.ID || d.DecidedBy != h.Admin.Actor() {
			t.Errorf("decision %+v %v", d, err)
		}
		if d, _ := h.Store.DiscoveryOf(ctx, h.SiteID, no); d.Acceptance != store.AcceptanceRejected {
			t.Errorf("rejected machine %+v", d)
		}
		if got := pendingMACs(); len(got) != 0 {
			t.Fatalf("pending after the decisions: %v", got)
		}

		// autoAccept: off by default; on, a new report is accepted by the pool, not enrolled.
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "gpu", store.PoolPolicy{HardwareProfile: "redfish", Labels: map[string]string{"class": "gpu"}, AutoAccept: true}); err != nil {
			t.Fatal(err)
		}
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{report(auto, "99999999-1111-4222-8333-000000000009"), report(no, "88888888-1111-4222-8333-000000000008")}); err != nil {
			t.Fatal(err)
		}
		if got := pendingMACs(); len(got) != 1 || got[auto] != "accepted/autoAccept:gpu" {
			t.Fatalf("pending with autoAccept: %v", got)
		}
		nodes, _, err := h.Metal.List(ctx, h.Admin, metal.ListInput{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 1 {
			t.Errorf("%d nodes: only the one an operator accepted may be enrolled", len(nodes))
		}

		// Two pools auto-accept: the GPU pool requires a GPU, default nothing; each machine goes
		// to the most specific pool it fits, by its self-asserted inventory.
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "gpu", store.PoolPolicy{HardwareProfile: "redfish", AutoAccept: true, HardwareRequirements: []string{"gpus>=1"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", AutoAccept: true}); err != nil {
			t.Fatal(err)
		}
		const withGPU, without = "52:54:00:aa:00:04", "52:54:00:aa:00:05"
		gpuReport := report(withGPU, "66666666-1111-4222-8333-000000000006")
		gpuReport.Inventory = `{"bootMac":"` + withGPU + `","systemUuid":"66666666-1111-4222-8333-000000000006","macs":["` + withGPU + `"],"pci":[{"address":"0000:41:00.0","gpu":true,"nvidia":true}]}`
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{gpuReport, report(without, "55555555-1111-4222-8333-000000000005")}); err != nil {
			t.Fatal(err)
		}
		if got := pendingMACs(); got[withGPU] != "accepted/autoAccept:gpu" || got[without] != "accepted/autoAccept:default" {
			t.Fatalf("pending with two auto-accepting pools: %v", got)
		}
	})
}
