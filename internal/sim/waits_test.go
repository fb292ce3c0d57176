package sim

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestCommandWaits: the waits for an agent that a phase reports are its commands' own, from
// queued to acknowledged, by where they run: every acknowledged command queued since the mark
// and none before it, each as its row has it.
func TestCommandWaits(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 2)
		rest(t, h, ids)
		mark := time.Now()
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "sim-image"}); err != nil {
			t.Fatal(err)
		}
		rest(t, h, ids)
		want := map[string][]time.Duration{}
		for _, id := range ids {
			cmds, err := st.Commands(ctx, id, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cmds {
				if c.CreatedAt >= mark.UnixMicro() && c.DeliveredAt > 0 {
					want[c.RunsOn] = append(want[c.RunsOn], time.Duration(c.DeliveredAt-c.CreatedAt)*time.Microsecond)
				}
			}
		}
		if len(want["site"]) == 0 || len(want["ramdisk"]) == 0 {
			t.Fatalf("the deploy's acknowledged commands by where they run: %v, want site and ramdisk ones", want)
		}
		got, ok, err := h.control().CommandWaits(ctx, mark)
		if err != nil || !ok {
			t.Fatalf("CommandWaits: %v (known: %v)", err, ok)
		}
		for on := range want {
			slices.Sort(want[on])
			slices.Sort(got[on])
		}
		if !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("waits since the deploy: %v, want %v", got, want)
		}
		// The phase's summary of them.
		w := waitsOf(got)["site"]
		if w.Commands != len(want["site"]) || w.P50 != want["site"][len(want["site"])/2] || w.P99 < w.P50 {
			t.Errorf("site waits summed up as %+v from %v", w, want["site"])
		}
		// Nothing queued after now.
		if later, _, err := h.control().CommandWaits(ctx, time.Now().Add(time.Hour)); err != nil || len(later) != 0 {
			t.Errorf("waits of commands queued in an hour: %v %v, want none", later, err)
		}
	})
}

// TestQueueDepths: doctor's queues are the commands no agent took yet, by site and by the
// agents they run on, with the oldest's queue time: while the site agent is paused, each
// enrolled node's first command waits for it; once it runs again, nothing waits.
func TestQueueDepths(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h := startEmpty(t, st, 0)
		h.Sim.SetFaults(Faults{SitePaused: true})
		ids, err := h.Enroll(ctx, "q", 3)
		if err != nil {
			t.Fatal(err)
		}
		var depths []store.QueueDepth
		waitFor(t, "a command of each node queued for the site agents", func() bool {
			depths, err = st.QueueDepths(ctx)
			return err == nil && len(depths) == 1 && depths[0].Commands == len(ids)
		})
		oldest := int64(0)
		for _, id := range ids {
			cmds, err := st.Commands(ctx, id, 10)
			if err != nil || len(cmds) != 1 || cmds[0].State != "queued" || cmds[0].RunsOn != "site" {
				t.Fatalf("node %s's commands with the site agent paused: %+v %v", id, cmds, err)
			}
			if oldest == 0 || cmds[0].CreatedAt < oldest {
				oldest = cmds[0].CreatedAt
			}
		}
		if d := depths[0]; d != (store.QueueDepth{SiteID: h.SiteID, RunsOn: "site", Commands: len(ids), Oldest: oldest}) {
			t.Errorf("queue %+v: want the site's %d commands for its site agents, the oldest queued at %d", d, len(ids), oldest)
		}
		h.Sim.SetFaults(Faults{})
		rest(t, h, ids)
		if depths, err := st.QueueDepths(ctx); err != nil || len(depths) != 0 {
			t.Errorf("queues once every node rests: %+v %v, want none", depths, err)
		}
	})
}
