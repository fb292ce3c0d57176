package sim

import (
	"context"
	"testing"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestSanbootEntryFollowsTheLease: an ISO inserted where the BMC has no virtual media becomes
// an iPXE sanboot entry at the site; when the boot lease moves to another site agent, the new
// holder is given that entry with the ISO (name, URL, sha256) to cache and verify, like the
// ramdisk and instance entries; a node whose BMC took the ISO as virtual media has none.
func TestSanbootEntryFollowsTheLease(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 2)
		rest(t, h, ids)
		m := h.Sim.Machine(ids[0])
		m.mu.Lock()
		m.NoVirtualMedia = true
		m.mu.Unlock()
		img := addBootISO(t, h, "cd")
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Profile: "boot-iso", Image: "rescue-iso"}); err != nil {
			t.Fatal(err)
		}
		for id, n := range rest(t, h, ids) {
			if n.State != "deployed" {
				t.Fatalf("%s: %s %s %s", id, n.State, n.FaultCode, n.FaultMsg)
			}
		}
		lease := func(agent string, req engine.LeaseRequest) engine.LeaseGrant { return bootLease(t, h, agent, req) }
		entryOf := func(g engine.LeaseGrant, node string) (engine.PushedEntry, bool) {
			for _, e := range g.Entries {
				if e.NodeID == node {
					return e, true
				}
			}
			return engine.PushedEntry{}, false
		}
		// site-a holds the lease, then hands it back; site-b takes it over and gets the table.
		if g := lease("site-a", engine.LeaseRequest{}); !g.Held || !g.Full {
			t.Fatalf("site-a: %+v", g)
		}
		lease("site-a", engine.LeaseRequest{Release: true})
		g := lease("site-b", engine.LeaseRequest{})
		if !g.Held || !g.Full {
			t.Fatalf("site-b did not take the lease with the whole table: %+v", g)
		}
		e, ok := entryOf(g, ids[0])
		if !ok || e.Kind != store.BootEntrySanboot || e.ISO == nil || e.ISO.Name != "rescue-iso.iso" || e.ISO.URL != img.URL || e.ISO.SHA256 != img.SHA256 ||
			len(e.MACs) == 0 || e.Token != "" {
			t.Fatalf("the new holder's entry of the sanboot node: %+v (found %t)", e, ok)
		}
		if e, ok := entryOf(g, ids[1]); ok && e.Kind == store.BootEntrySanboot {
			t.Errorf("the virtual-media node has a sanboot entry: %+v", e)
		}
		// A renewal at the same revision brings nothing again.
		if g2 := lease("site-b", engine.LeaseRequest{Epoch: g.Epoch, KnownRevision: g.Revision}); g2.Full || len(g2.Entries) != 0 {
			t.Errorf("renewal: %+v", g2)
		}
	})
}
