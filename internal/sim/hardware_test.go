package sim

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"bcd/internal/hardware"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A node inspected again after a DIMM was lost and a disk replaced records what changed
// (node.hardware.changed, from the inventory before to the new one); inspected again with
// nothing changed, it records nothing; its inventory is the newest.
func TestHardwareChangedOnInspection(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 1)
		rest(t, h, ids)
		m := h.Sim.Machine(ids[0])
		changed := func() []store.Event {
			t.Helper()
			all, err := st.Events(ctx, store.EventFilter{NodeID: ids[0], Limit: 10000})
			if err != nil {
				t.Fatal(err)
			}
			return slices.DeleteFunc(all, func(e store.Event) bool { return e.Kind != "node.hardware.changed" })
		}
		if evs := changed(); len(evs) != 0 {
			t.Fatalf("a first inventory recorded changes: %+v", evs)
		}
		inspect := func() {
			t.Helper()
			if err := h.Apply(ctx, provision.VerbInspect, ids, metal.VerbInput{Reason: "after a repair"}); err != nil {
				t.Fatal(err)
			}
			if got := rest(t, h, ids); got[ids[0]].State != "ready" {
				t.Fatalf("after inspection: %+v", got[ids[0]])
			}
		}
		// Nothing changed: nothing recorded.
		inspect()
		if evs := changed(); len(evs) != 0 {
			t.Fatalf("an unchanged inventory recorded changes: %+v", evs)
		}
		hw := SimHardware()
		hw.Memory.TotalBytes -= 8 << 30
		hw.Disks[0].Serial, hw.Disks[0].SizeBytes = "NEW-1", 960e9
		m.SetHardware(hw)
		inspect()
		evs := changed()
		if len(evs) != 1 || evs[0].FromState != "inspecting" {
			t.Fatalf("node.hardware.changed events: %+v, want one, while inspecting", evs)
		}
		var data struct {
			Changes    []hardware.Change
			PreviousAt string
		}
		if err := json.Unmarshal([]byte(evs[0].Data), &data); err != nil {
			t.Fatal(err)
		}
		want := []hardware.Change{{What: "memory", From: "32GiB", To: "24GiB"}, {What: "disk.total", From: "480000000000B", To: "960000000000B"}, {What: "disks.serial", From: "", To: "NEW-1"}}
		if !slices.Equal(data.Changes, want) || data.PreviousAt == "" || evs[0].Reason != "the inventory differs from the one reported before in memory, disk.total, disks.serial" {
			t.Fatalf("the event: %s (%s), want changes %+v", evs[0].Data, evs[0].Reason, want)
		}
		inv, err := h.Metal.Inventory(ctx, h.Admin, ids[0])
		if err != nil || inv.Facts.MemoryBytes != 24<<30 || inv.Facts.LargestDiskBytes != 960e9 {
			t.Fatalf("the stored inventory after the change: %+v, %v", inv.Facts, err)
		}
	})
}

// A pool's hardware requirements are checked at every inspection: a machine short of memory
// fails enrolment with HARDWARE_MISMATCH, saying what it has, its inventory kept; once its
// memory is back, recover inspects it again and it becomes ready. A policy with a requirement
// that does not parse is refused.
func TestPoolHardwareRequirements(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := Start(ctx, st, Config{}, engineConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		var invalid *metal.InvalidError
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", HardwareRequirements: []string{"ram>=1GiB"}}); !errors.As(err, &invalid) ||
			invalid.Field != "policy.hardware_requirements" || !strings.Contains(err.Error(), `unknown key "ram"`) {
			t.Fatalf("a policy requiring ram: %v", err)
		}
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", HardwareRequirements: []string{"memory>=64GiB", "cpu.cores>=8"}}); err != nil {
			t.Fatal(err)
		}
		ids, err := h.Enroll(ctx, "hwreq", 1)
		if err != nil {
			t.Fatal(err)
		}
		n := rest(t, h, ids)[ids[0]]
		if n.State != "failed" || n.FailedFrom != "inspecting" || n.FaultCode != string(provision.FaultHardwareMismatch) || !n.Maintenance ||
			!strings.Contains(n.FaultMsg, "does not meet pool default's hardware requirements: memory>=64GiB: it has 32GiB (bcd node inventory") || strings.Contains(n.FaultMsg, "cpu.cores") {
			t.Fatalf("enrolment of a 32 GiB machine: %s from %s, %s %q (maintenance %v)", n.State, n.FailedFrom, n.FaultCode, n.FaultMsg, n.Maintenance)
		}
		if inv, err := h.Metal.Inventory(ctx, h.Admin, ids[0]); err != nil || inv.Facts.MemoryBytes != 32<<30 {
			t.Fatalf("the inventory of the machine that failed: %+v, %v", inv.Facts, err)
		}
		hw := SimHardware()
		hw.Memory.TotalBytes = 128 << 30
		h.Sim.Machine(ids[0]).SetHardware(hw)
		if err := h.Apply(ctx, provision.VerbRecover, ids, metal.VerbInput{Reason: "DIMMs fitted"}); err != nil {
			t.Fatal(err)
		}
		if n := rest(t, h, ids)[ids[0]]; n.State != "ready" {
			t.Fatalf("recover after the repair: %s %s %s", n.State, n.FaultCode, n.FaultMsg)
		}
		if short, err := h.Metal.HardwareShort(ctx, h.Admin, 10); err != nil || len(short) != 0 {
			t.Fatalf("the doctor's machines short of their pool's requirements, all met: %+v, %v", short, err)
		}
		// A requirement raised after the inspection: the ready machine keeps working, and the
		// doctor names it with what it has.
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", HardwareRequirements: []string{"memory>=256GiB", "cpu.cores>=8"}}); err != nil {
			t.Fatal(err)
		}
		short, err := h.Metal.HardwareShort(ctx, h.Admin, 10)
		if err != nil || len(short) != 1 || short[0].Node.ID != ids[0] || !slices.Equal(short[0].Unmet, []string{"memory>=256GiB: it has 128GiB"}) {
			t.Fatalf("the doctor's machines short of their pool's requirements: %+v, %v", short, err)
		}
	})
}
