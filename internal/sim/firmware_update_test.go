package sim

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"

	"bcd/internal/catalog"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// addFirmwareImage registers a signed firmware image in the catalog.
func addFirmwareImage(t *testing.T, h *Harness, name, hexByte string) {
	t.Helper()
	ctx := context.Background()
	pub, key, _ := ed25519.GenerateKey(nil)
	signer := "fw-signer-" + name
	if err := h.Metal.AddSigner(ctx, h.Admin, signer, pub); err != nil {
		t.Fatal(err)
	}
	img := catalog.Image{Name: name, URL: "http://images.sim/" + name + ".bin", Size: 1 << 20, Format: catalog.FormatFirmware, Compression: "none",
		SHA256: strings.Repeat(hexByte, 64), Signer: signer}
	img.Signature = catalog.Sign(img, key)
	if err := h.Metal.AddImage(ctx, h.Admin, img); err != nil {
		t.Fatal(err)
	}
}

// A pool's firmware images are installed at commissioning where a component runs another
// version than the baseline's, before the ramdisk boots: the boot applies them (the enroll
// chain's lingering ramdisk is not used), and the baseline is checked after it. A machine already
// on the baseline installs nothing, keeps the fast track, and is checked once too.
func TestFirmwareUpdate(t *testing.T) {
	cases := []struct {
		name     string
		baseline string // BIOS version the baseline wants
		// images installed, bmc.firmware commands, firmware queries, power cycles.
		installed, commands, queries, cycles int
	}{
		{"updated", "sim-bios-2.0", 1, 1, 1, 2},
		{"already on the baseline", SimFirmwareBIOS, 0, 1, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				h, err := Start(ctx, st, Config{}, engineConfig(), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(h.Stop)
				addFirmwareImage(t, h, "bios-fw", "b")
				if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish",
					FirmwareBaseline: map[string]string{"BIOS": c.baseline}, FirmwareImages: map[string]string{"BIOS": "bios-fw"}}); err != nil {
					t.Fatal(err)
				}
				ids, err := h.Enroll(ctx, "fwu", 1)
				if err != nil {
					t.Fatal(err)
				}
				id := ids[0]
				if n := rest(t, h, ids)[id]; n.State != "ready" {
					t.Fatalf("after enroll: %s (%s %s), want ready", n.State, n.FaultCode, n.FaultMsg)
				}
				m := h.Sim.Machine(id)
				m.mu.Lock()
				installed, fw := m.FirmwareUpdates, m.firmware()[0]
				m.mu.Unlock()
				if installed != c.installed || fw.Version != c.baseline {
					t.Errorf("%d images installed, BIOS runs %s; want %d, %s", installed, fw.Version, c.installed, c.baseline)
				}
				counts := commandCounts(t, st, id)
				updates, queries, cycles := counts["bmc.firmware"], counts["bmc.query{firmware}"], counts["bmc.power{cycle}"]
				if updates != c.commands || queries != c.queries || cycles != c.cycles {
					t.Errorf("%d bmc.firmware, %d firmware queries, %d power cycles; want %d, %d, %d", updates, queries, cycles, c.commands, c.queries, c.cycles)
				}
				if !hasEvent(t, st, id, "node.firmware.update", `"pending":`+map[bool]string{true: "true", false: "false"}[c.installed > 0]) {
					t.Error("no node.firmware.update event")
				}
			})
		})
	}
}

// At release, a baseline moved since the machine was commissioned is installed; an image the BMC
// installs and does not apply is caught by the check after the wipe (FIRMWARE_DRIFT), and a
// failed update task fails the step naming it; once the BMC works, recover installs and checks
// it.
func TestFirmwareUpdateAtRelease(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := Start(ctx, st, Config{}, engineConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	addFirmwareImage(t, h, "bios-fw-2", "c")
	setPolicy := func(version string) {
		t.Helper()
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish",
			FirmwareBaseline: map[string]string{"BIOS": version}, FirmwareImages: map[string]string{"BIOS": "bios-fw-2"}}); err != nil {
			t.Fatal(err)
		}
	}
	setPolicy(SimFirmwareBIOS)
	ids, err := h.Enroll(ctx, "fwr", 1)
	if err != nil {
		t.Fatal(err)
	}
	id := ids[0]
	if n := rest(t, h, ids)[id]; n.State != "ready" {
		t.Fatalf("enroll: %s %s", n.State, n.FaultMsg)
	}
	m := h.Sim.Machine(id)
	setMachine := func(f func()) {
		m.mu.Lock()
		defer m.mu.Unlock()
		f()
	}
	cycle := func(verb provision.Verb, in metal.VerbInput, want string) store.Node {
		t.Helper()
		if err := h.Apply(ctx, verb, ids, in); err != nil {
			t.Fatal(err)
		}
		n := rest(t, h, ids)[id]
		if n.State != want {
			t.Fatalf("%s: %s %s %s, want %s", verb, n.State, n.FaultCode, n.FaultMsg, want)
		}
		return n
	}
	cycle(provision.VerbDeploy, metal.VerbInput{Image: "img"}, "deployed")
	setPolicy("sim-bios-2.0")
	setMachine(func() { m.FirmwareUpdateIgnored = true })
	n := cycle(provision.VerbUndeploy, metal.VerbInput{Reason: "tenant left", Wipe: "quick"}, "failed")
	if n.FailedFrom != "releasing" || n.FaultCode != string(provision.FaultFirmwareDrift) || !strings.Contains(n.FaultMsg, "BIOS: runs "+SimFirmwareBIOS+", want sim-bios-2.0") {
		t.Fatalf("ignored update: failed from %s %s %q, want FIRMWARE_DRIFT from releasing", n.FailedFrom, n.FaultCode, n.FaultMsg)
	}
	setMachine(func() { m.FirmwareUpdateIgnored, m.FirmwareUpdateFails = false, true })
	n = cycle(provision.VerbRecover, metal.VerbInput{Reason: "BMC reset"}, "failed")
	if n.FaultCode != string(provision.FaultStepFailed) || !strings.Contains(n.FaultMsg, "simulated flash failure") {
		t.Fatalf("failed update: %s %q, want STEP_FAILED naming the task's error", n.FaultCode, n.FaultMsg)
	}
	setMachine(func() { m.FirmwareUpdateFails = false })
	cycle(provision.VerbRecover, metal.VerbInput{Reason: "BMC fixed"}, "ready")
	setMachine(func() {
		if v := m.firmware()[0].Version; v != "sim-bios-2.0" {
			t.Errorf("after recover: BIOS runs %s, want sim-bios-2.0", v)
		}
	})
}
