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

// TestAcceptInband: a machine waiting in a discovery-mode ramdisk is accepted --inband: it is
// enrolled with no BMC address and a generated, sealed credential; the ramdisk learns its
// decision from its new boot entry and joins as the node without a power cycle, provisions
// the credential over the host's IPMI interface (bmc.provisionInband, under the chain's
// batch), and the node carries the address it reported; the site agent's out-of-band steps
// then run with it and the chain reaches ready. A host without an IPMI interface fails the
// step; the operator's inputs that make no sense in-band are refused. A pool with autoAccept and
// autoAcceptInband accepts and enrolls a reported machine the same way, once.
func TestAcceptInband(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := Start(ctx, st, Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		if _, err := h.Metal.CreatePool(ctx, h.Admin, "ipmi", "default", store.PoolPolicy{HardwareProfile: "ipmi"}); err != nil {
			t.Fatal(err)
		}
		site := engine.Agent{ID: "sim-site-1", Kind: "site", SiteID: h.SiteID}
		const (
			mac   = "52:54:00:bb:00:01"
			uuid  = "99999999-1111-4222-8333-000000000009"
			nomac = "52:54:00:bb:00:02"
			nouid = "99999999-1111-4222-8333-00000000000a"
		)
		now := time.Now()
		var ds []engine.Discovery
		for _, m := range [][2]string{{mac, uuid}, {nomac, nouid}} {
			ds = append(ds, engine.Discovery{MAC: m[0], UUID: m[1], FirstSeen: now, LastSeen: now,
				Inventory: `{"bootMac":"` + m[0] + `","systemUuid":"` + m[1] + `","macs":["` + m[0] + `"]}`})
		}
		if err := h.Engine.RecordDiscovered(ctx, site, ds); err != nil {
			t.Fatal(err)
		}
		for _, bad := range []struct {
			bmc  metal.BMCInput
			want string
		}{
			{metal.BMCInput{Inband: true, Address: "10.0.0.1"}, "give neither"},
			{metal.BMCInput{Inband: true, Password: "x"}, "give neither"},
			{metal.BMCInput{Inband: true, Driver: "redfish"}, "over IPMI"},
			{metal.BMCInput{Inband: true, Username: "a user"}, "printable"},
		} {
			if _, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: mac, Pool: "ipmi", Name: "x", BMC: bad.bmc}); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("accept %+v: %v, want %q", bad.bmc, err, bad.want)
			}
		}
		if _, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: "y", Pool: "ipmi", MACs: []string{"52:54:00:bb:00:99"}, BMC: metal.BMCInput{Inband: true}}); err == nil || !strings.Contains(err.Error(), "accept") {
			t.Errorf("enroll --inband: %v", err)
		}

		n, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: mac, Pool: "ipmi", Name: "inb-1", BMC: metal.BMCInput{Inband: true}})
		if err != nil {
			t.Fatal(err)
		}
		if n.BMCAddress != "" || n.BMCDriver != "ipmi" || n.BMCPasswordRef == "" {
			t.Fatalf("accepted node's BMC: %q %q %q", n.BMCDriver, n.BMCAddress, n.BMCPasswordRef)
		}
		bad, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: nomac, Pool: "ipmi", Name: "inb-2", BMC: metal.BMCInput{Inband: true}})
		if err != nil {
			t.Fatal(err)
		}
		h.Sim.Add(&Machine{NodeID: n.ID, UUID: uuid, MACs: []string{mac}, Discovering: true, InbandBMC: "10.77.0.5:6230"})
		h.Sim.Add(&Machine{NodeID: bad.ID, UUID: nouid, MACs: []string{nomac}, Discovering: true})
		h.Engine.Nudge()
		got, err := h.WaitRest(ctx, []string{n.ID, bad.ID}, 30*time.Second)
		if err != nil {
			for _, id := range []string{n.ID, bad.ID} {
				evs, _ := h.Store.Events(ctx, store.EventFilter{NodeID: id, Limit: 500})
				for _, e := range evs {
					t.Logf("%s %s %s→%s %s %s", id, e.Kind, e.FromState, e.ToState, e.Reason, e.Data)
				}
			}
			t.Fatal(err)
		}
		if g := got[n.ID]; g.State != "ready" || g.BMCAddress != "10.77.0.5:6230" {
			t.Fatalf("in-band node: %s %s %s, BMC %q", g.State, g.FaultCode, g.FaultMsg, g.BMCAddress)
		}
		if g := got[bad.ID]; g.State != "failed" || g.BMCAddress != "" || !strings.Contains(g.FaultMsg, "ipmi0") {
			t.Fatalf("node without IPMI: %s %s %q, BMC %q", g.State, g.FaultCode, g.FaultMsg, g.BMCAddress)
		}
		evs, err := h.Store.Events(ctx, store.EventFilter{NodeID: n.ID, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, e.Kind)
		}
		all := strings.Join(kinds, " ")
		if !strings.Contains(all, "node.bmc.inband") {
			t.Fatalf("events: %s", all)
		}
		// One boot: the ramdisk that provisioned the credential was the discovery-mode one.
		if c := h.Sim.Executions(); c["bmc.power"] != 0 {
			t.Errorf("power actions: %v (the accepted machine needs no power cycle)", c)
		}

		// autoAccept with an in-band policy: the pool accepts and enrolls what reports.
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "ipmi", store.PoolPolicy{HardwareProfile: "ipmi", AutoAcceptInband: true}); err == nil || !strings.Contains(err.Error(), "auto_accept") {
			t.Errorf("autoAcceptInband without autoAccept: %v", err)
		}
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "ipmi", store.PoolPolicy{HardwareProfile: "ipmi", AutoAccept: true, AutoAcceptInband: true}); err != nil {
			t.Fatal(err)
		}
		const (
			autoMAC  = "52:54:00:bb:00:03"
			autoUUID = "99999999-1111-4222-8333-00000000000b"
		)
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{{MAC: autoMAC, UUID: autoUUID, FirstSeen: now, LastSeen: now,
			Inventory: `{"bootMac":"` + autoMAC + `","systemUuid":"` + autoUUID + `","macs":["` + autoMAC + `"]}`}}); err != nil {
			t.Fatal(err)
		}
		an, err := h.Metal.Get(ctx, h.Admin, metal.AutoInbandName(autoMAC))
		if err != nil {
			t.Fatalf("the auto-accepted machine was not enrolled: %v", err)
		}
		h.Sim.Add(&Machine{NodeID: an.ID, UUID: autoUUID, MACs: []string{autoMAC}, Discovering: true, InbandBMC: "10.77.0.6"})
		h.Engine.Nudge()
		got, err = h.WaitRest(ctx, []string{an.ID}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if g := got[an.ID]; g.State != "ready" || g.BMCAddress != "10.77.0.6" || g.ProductUUID != autoUUID {
			t.Fatalf("auto-enrolled node: %s %s %s, BMC %q", g.State, g.FaultCode, g.FaultMsg, g.BMCAddress)
		}
		if d, err := h.Store.DiscoveryOf(ctx, h.SiteID, autoMAC); err != nil || d.Acceptance != store.AcceptanceAccepted || d.NodeID != an.ID || d.DecidedBy != "token:autoAccept:ipmi" {
			t.Errorf("auto decision %+v %v", d, err)
		}
		// A second report of the same machine enrolls nothing again.
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{{MAC: autoMAC, UUID: autoUUID, FirstSeen: now, LastSeen: now,
			Inventory: `{"bootMac":"` + autoMAC + `"}`}}); err != nil {
			t.Fatal(err)
		}
	})
}
