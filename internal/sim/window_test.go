package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// setWindow sets the default pool's fast-track window.
func setWindow(t *testing.T, h *Harness, window string) {
	t.Helper()
	if _, err := h.Metal.UpdatePool(context.Background(), h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", FastTrackWindow: window}); err != nil {
		t.Fatal(err)
	}
}

// bootCommands lists the node's commands that make it boot or that boot it from the network:
// BMC power actions, boot-device changes to PXE, ramdisk boot entries. created after since.
func bootCommands(t *testing.T, st *store.Store, nodeID string, since int64) []string {
	t.Helper()
	cmds, err := st.Commands(context.Background(), nodeID, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cmds {
		if c.CreatedAt <= since {
			continue
		}
		var args struct {
			Action string `json:"action"`
			Device string `json:"device"`
		}
		_ = json.Unmarshal([]byte(c.Args), &args)
		switch {
		case c.Kind == "bmc.power", c.Kind == "boot.prepareRamdisk", c.Kind == "bmc.boot" && args.Device == "pxe":
			out = append(out, c.Kind+" "+args.Action+args.Device)
		}
	}
	return out
}

// oneNode starts a simulation on st with cfg, sets the default pool's fast-track window (unless
// window is empty) and enrolls one node named after prefix.
func oneNode(t *testing.T, st *store.Store, cfg Config, window, prefix string) (*Harness, string) {
	t.Helper()
	h, err := Start(context.Background(), st, cfg, engineConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	if window != "" {
		setWindow(t, h, window)
	}
	ids, err := h.Enroll(context.Background(), prefix, 1)
	if err != nil {
		t.Fatal(err)
	}
	return h, ids[0]
}

func node(t *testing.T, st *store.Store, id string) store.Node {
	t.Helper()
	n, err := st.Node(context.Background(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDeployInsideTheWindowNeedsNoBoot: after commissioning the ramdisk lingers (the BMC does
// not power the node off); a deploy inside the window runs in it: no power action, no PXE boot
// device, no boot entry, and it ends by kexec into the installed OS.
func TestDeployInsideTheWindowNeedsNoBoot(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, id := oneNode(t, st, Config{}, "1h", "ft")
		ids := []string{id}
		n := rest(t, h, ids)[id]
		if n.State != "ready" || n.Power != "on" || n.LingerUntil == 0 || n.LingerCommand != "" {
			t.Fatalf("after enroll: %s power %s lingering until %d (command %q), want ready, on, lingering", n.State, n.Power, n.LingerUntil, n.LingerCommand)
		}
		if until := store.Micros(n.LingerUntil); until.Before(time.Now().Add(50*time.Minute)) || until.After(time.Now().Add(61*time.Minute)) {
			t.Errorf("lingering until %s, want about an hour from now", until)
		}
		if !h.Sim.Machine(id).Powered() {
			t.Fatal("the machine is off after commissioning with a window")
		}
		if !hasEvent(t, st, id, "node.ramdisk.linger", `"window":"1h0m0s"`) {
			t.Error("no node.ramdisk.linger event")
		}
		a, err := h.Metal.Activity(ctx, h.Admin, n)
		if err != nil || a.RamdiskLingeringUntil != n.LingerUntil || a.RamdiskPoweringOff {
			t.Errorf("activity %+v (%v): want the ramdisk lingering until %d", a, err, n.LingerUntil)
		}
		for _, c := range bootCommands(t, st, id, 0) {
			if c == "bmc.power off" {
				t.Errorf("commissioning with a window powered the node off through the BMC")
			}
		}
		before := n.UpdatedAt
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
			t.Fatal(err)
		}
		n = rest(t, h, ids)[id]
		if n.State != "deployed" {
			t.Fatalf("deploy: %s (%s)", n.State, n.FaultMsg)
		}
		if got := bootCommands(t, st, id, before); len(got) != 0 {
			t.Errorf("the deploy inside the window sent %v, want no power or network-boot command", got)
		}
		if n.LingerUntil != 0 || n.LingerCommand != "" {
			t.Errorf("still lingering after the deploy: %d %q", n.LingerUntil, n.LingerCommand)
		}
		if !hasEvent(t, st, id, "node.ramdisk.linger.end", `"profile":"default"`) {
			t.Error("no event for the deploy taking the lingering ramdisk")
		}
		cmds, _ := st.Commands(ctx, id, 1000)
		kexec := false
		for _, c := range cmds {
			kexec = kexec || c.Kind == "boot.kexec" && c.CreatedAt > before
			if c.Kind == "ramdisk.powerOff" {
				t.Errorf("a power-off was sent to the ramdisk: %s %s", c.ID, c.State)
			}
		}
		if !kexec {
			t.Error("the deploy did not end by kexec")
		}
		if got := h.Sim.SelfPowerOffs(); got != 0 {
			t.Errorf("%d ramdisks powered off", got)
		}
	})
}

// TestWindowPassesPowersOff: with no workflow in the window the ramdisk powers its own host off
// (no BMC command), the node stays ready and its power axis says off.
func TestWindowPassesPowersOff(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, id := oneNode(t, st, Config{}, "300ms", "ft")
		ids := []string{id}
		rest(t, h, ids)
		var n store.Node
		// The ramdisk reports, then powers its host off: the node's power axis may say off a
		// moment before the machine is.
		waitFor(t, "the lingering ramdisk to power its host off", func() bool {
			n = node(t, st, id)
			return n.LingerUntil == 0 && n.LingerCommand == "" && n.Power == "off" && !h.Sim.Machine(id).Powered()
		})
		if n.State != "ready" || n.TargetState != "" || n.Maintenance {
			t.Errorf("after the window: %s → %q maintenance %v, want ready", n.State, n.TargetState, n.Maintenance)
		}
		if got := h.Sim.SelfPowerOffs(); got != 1 {
			t.Errorf("%d ramdisk self power-offs, want 1", got)
		}
		for _, c := range bootCommands(t, st, id, 0) {
			if c == "bmc.power off" {
				t.Error("the BMC powered the node off (the ramdisk should have)")
			}
		}
		var off store.Command
		cmds, _ := st.Commands(ctx, id, 1000)
		for _, c := range cmds {
			if c.Kind == "ramdisk.powerOff" {
				off = c
			}
		}
		if off.State != "succeeded" {
			t.Errorf("ramdisk.powerOff %q, want succeeded", off.State)
		}
		if !hasEvent(t, st, id, "node.ramdisk.powerOff", off.ID) || !hasEvent(t, st, id, "node.ramdisk.linger.end", off.ID) {
			t.Error("the power-off is not in the node's events")
		}
		// Off, a deploy boots the ramdisk again.
		before := n.UpdatedAt
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
			t.Fatal(err)
		}
		if n := rest(t, h, ids)[id]; n.State != "deployed" {
			t.Fatalf("deploy: %s (%s)", n.State, n.FaultMsg)
		}
		if got := bootCommands(t, st, id, before); len(got) == 0 {
			t.Error("the deploy after the window booted nothing")
		}
	})
}

// TestDeployAfterThePowerOffWasOfferedBoots: a deploy that starts after the ramdisk took its
// power-off (here: it never finishes it) does not use that ramdisk: it boots the node again.
func TestDeployAfterThePowerOffWasOfferedBoots(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, id := oneNode(t, st, Config{Faults: Faults{Hang: map[string]bool{"ramdisk.powerOff": true}}}, "200ms", "ft")
	ids := []string{id}
	rest(t, h, ids)
	var n store.Node
	waitFor(t, "the ramdisk to take its power-off", func() bool {
		n = node(t, st, id)
		if n.LingerCommand == "" {
			return false
		}
		c, err := st.Command(ctx, n.LingerCommand)
		return err == nil && c.State == "delivered"
	})
	before := n.UpdatedAt
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	if n := rest(t, h, ids)[id]; n.State != "deployed" {
		t.Fatalf("deploy: %s (%s)", n.State, n.FaultMsg)
	}
	got := bootCommands(t, st, id, before)
	cycled := false
	for _, c := range got {
		cycled = cycled || c == "bmc.power cycle"
	}
	if !cycled {
		t.Errorf("the deploy sent %v, want a power cycle (the ramdisk was told to power off)", got)
	}
	if !hasEvent(t, st, id, "node.ramdisk.linger.end", "default") {
		t.Error("no event for the deploy ending the linger")
	}
}

func engineConfig() engine.Config {
	return engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}
}

// TestWindowEndsWithTheRamdiskGone: a ramdisk that is not connected when the window passes is
// sent nothing (no power-off waits for a later boot of the node); the window ends with an event
// saying so and the node stays ready.
func TestWindowEndsWithTheRamdiskGone(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, id := oneNode(t, st, Config{}, "1h", "ft")
	ids := []string{id}
	rest(t, h, ids)
	h.Sim.Machine(id).CrashRamdisk()
	waitFor(t, "the crashed ramdisk's agent to be gone", func() bool {
		var since int64
		err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			since, err = tx.NodeAgentConnectedSince(ctx, id, "node", 1)
			return err
		})
		return err == nil && since == 0
	})
	// The window passes now.
	err := st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, id, "")
		if err != nil {
			return err
		}
		n.LingerUntil = 1
		if err := tx.UpdateNode(ctx, &n); err != nil {
			return err
		}
		return tx.Wake(ctx, id, "test: the window passed", 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Engine.Nudge()
	waitFor(t, "the window to end", func() bool { return node(t, st, id).LingerUntil == 0 })
	n := node(t, st, id)
	if n.State != "ready" || n.LingerCommand != "" {
		t.Errorf("after the window: %s, power-off command %q", n.State, n.LingerCommand)
	}
	evs, err := st.Events(ctx, store.EventFilter{NodeID: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	gone := false
	for _, e := range evs {
		gone = gone || e.Kind == "node.ramdisk.linger.end" && strings.Contains(e.Reason, "the ramdisk is gone")
	}
	if !gone || hasEvent(t, st, id, "node.ramdisk.powerOff", "") {
		t.Error("want the window to end because the ramdisk is gone, and no power-off")
	}
	cmds, _ := st.Commands(ctx, id, 1000)
	for _, c := range cmds {
		if c.Kind == "ramdisk.powerOff" {
			t.Errorf("a power-off was queued for a ramdisk that is gone: %s", c.State)
		}
	}
}

// TestInspectInsideTheWindow: an inspection started inside the window runs in the lingering
// ramdisk (no boot) and leaves it lingering again, for a new window.
func TestInspectInsideTheWindow(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, id := oneNode(t, st, Config{}, "1h", "ft")
	ids := []string{id}
	first := rest(t, h, ids)[id]
	if err := h.Apply(ctx, provision.VerbInspect, ids, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	n := rest(t, h, ids)[id]
	if n.State != "ready" || n.LingerUntil <= first.LingerUntil || n.Power != "on" {
		t.Fatalf("after inspect: %s lingering until %d (before %d), power %s", n.State, n.LingerUntil, first.LingerUntil, n.Power)
	}
	if got := bootCommands(t, st, id, first.UpdatedAt); len(got) != 0 {
		t.Errorf("the inspection inside the window sent %v", got)
	}
	if !hasEvent(t, st, id, "node.ramdisk.linger.end", `"profile":"metal-inspect"`) {
		t.Error("no event for the inspection taking the ramdisk")
	}
}

// TestKexecFallsBackToABMCReboot: a ramdisk that cannot kexec (or an OS that never rejoins after
// it) does not fail the deploy: the BMC power-cycles the node into its disk (boot device set by
// the deploy) and the installed OS is awaited again.
func TestKexecFallsBackToABMCReboot(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, id := oneNode(t, st, Config{Faults: Faults{KexecFail: true}}, "", "kx")
		ids := []string{id}
		if n := rest(t, h, ids)[id]; n.State != "ready" {
			t.Fatalf("after enroll: %s (%s)", n.State, n.FaultMsg)
		}
		before := node(t, st, id).UpdatedAt
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
			t.Fatal(err)
		}
		n := rest(t, h, ids)[id]
		if n.State != "deployed" {
			t.Fatalf("deploy with a failing kexec: %s (%s), want deployed through the BMC fallback", n.State, n.FaultMsg)
		}
		cmds, _ := st.Commands(ctx, id, 1000)
		var kexecFailed, cycleAfter bool
		var kexecAt int64
		for _, c := range cmds {
			if c.Kind == "boot.kexec" && c.CreatedAt > before {
				kexecFailed, kexecAt = c.State == "failed", c.CreatedAt
			}
		}
		for _, c := range cmds {
			cycleAfter = cycleAfter || kexecAt > 0 && c.Kind == "bmc.power" && c.CreatedAt > kexecAt && strings.Contains(c.Args, "cycle")
		}
		if !kexecFailed || !cycleAfter {
			t.Errorf("kexec failed %v, power cycle after it %v: want both", kexecFailed, cycleAfter)
		}
		if !hasEvent(t, st, id, "workflow.step", `"result":"fallback"`) {
			t.Error("no event for the fallback")
		}
	})
}
