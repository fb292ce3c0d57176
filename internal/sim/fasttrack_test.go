package sim

import (
	"context"
	"encoding/json"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// TestFastTrackSkipsTheSecondBoot: in the enroll chain, commissioning follows inspection while
// the ramdisk is still up, so its metal.ensureRamdisk (boot entry, boot device, power cycle,
// await) is skipped: one power cycle for the whole chain, not two. After commissioning powered
// the node off, a deploy boots the ramdisk again.
func TestFastTrackSkipsTheSecondBoot(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, ids := start(t, st, 1)
		rest(t, h, ids)
		ctx := context.Background()
		cycles := func() int {
			cmds, err := st.Commands(ctx, ids[0], 500)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, c := range cmds {
				var args struct {
					Action string `json:"action"`
				}
				_ = json.Unmarshal([]byte(c.Args), &args)
				if c.Kind == "bmc.power" && args.Action == "cycle" {
					n++
				}
			}
			return n
		}
		if got := cycles(); got != 1 {
			t.Errorf("enroll → ready power-cycled %d times, want 1 (commissioning fast-tracked)", got)
		}
		evs, err := st.Events(ctx, store.EventFilter{NodeID: ids[0], Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		skipped := 0
		for _, e := range evs {
			if e.Kind == "workflow.step" && e.Reason == "fast track: the node's ramdisk is up" {
				skipped++
			}
		}
		// Every step of metal.ensureRamdisk, those for MAC-less nodes included.
		ensure, _ := workflow.LookupStep("metal.ensureRamdisk")
		if skipped != len(ensure.Expand) {
			t.Errorf("%d steps recorded as fast-tracked, want the %d of metal.ensureRamdisk", skipped, len(ensure.Expand))
		}
	})
}
