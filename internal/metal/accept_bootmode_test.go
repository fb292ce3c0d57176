package metal_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestAcceptWithBootMode: a discovered legacy-BIOS machine is accepted with its boot mode, as
// an enrolled one is; a bad mode is refused with what is accepted, and nothing is enrolled.
func TestAcceptWithBootMode(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := sim.Start(ctx, st, sim.Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		if _, err := h.Metal.CreatePool(ctx, h.Admin, "ipmi", "default", store.PoolPolicy{HardwareProfile: "ipmi"}); err != nil {
			t.Fatal(err)
		}
		const mac, uuid = "52:54:00:bd:00:01", "99999999-1111-4222-8333-0000000000d1"
		now := time.Now()
		site := engine.Agent{ID: "sim-site-1", Kind: "site", SiteID: h.SiteID}
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{{MAC: mac, UUID: uuid, FirstSeen: now, LastSeen: now,
			Inventory: `{"bootMac":"` + mac + `","systemUuid":"` + uuid + `","macs":["` + mac + `"]}`}}); err != nil {
			t.Fatal(err)
		}
		in := metal.AcceptInput{Site: "default", MAC: mac, Pool: "ipmi", Name: "legacy-accepted", BMC: metal.BMCInput{Inband: true}, BootMode: "bios"}
		_, err = h.Metal.AcceptDiscovered(ctx, h.Admin, in)
		var inv *metal.InvalidError
		if !errors.As(err, &inv) || inv.Field != "boot_mode" || !strings.Contains(err.Error(), "accepted are uefi, legacy") {
			t.Fatalf("accept with boot mode bios: %v", err)
		}
		if _, err := st.Node(ctx, "legacy-accepted", ""); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused accept enrolled the node: %v", err)
		}
		in.BootMode = "legacy"
		n, err := h.Metal.AcceptDiscovered(ctx, h.Admin, in)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := st.Node(ctx, n.ID, ""); err != nil || got.BootMode != "legacy" {
			t.Fatalf("accepted node's boot mode %q (%v), want legacy", got.BootMode, err)
		}
	})
}
