package sim

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/catalog"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestMediaInsertStep: media.insert{image} of an operator profile sends bmc.media with the
// catalog ISO's URL and digest (checked against its signature when the command is built);
// management.setBootDevice{device: cd} follows; a non-ISO image is refused before anything is
// sent; media.eject empties the CD.
func TestMediaInsertStep(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 2)
		rest(t, h, ids)
		img := addBootISO(t, h, "ab")
		if err := h.Apply(ctx, provision.VerbDeploy, ids[:1], metal.VerbInput{Profile: "boot-iso", Image: "rescue-iso"}); err != nil {
			t.Fatal(err)
		}
		if err := h.Apply(ctx, provision.VerbDeploy, ids[1:], metal.VerbInput{Profile: "boot-iso", Image: "img"}); err != nil {
			t.Fatal(err)
		}
		got := rest(t, h, ids)
		if n := got[ids[0]]; n.State != "deployed" {
			t.Fatalf("ISO node: %s %s %s", n.State, n.FaultCode, n.FaultMsg)
		}
		if got := media(h.Sim.Machine(ids[0])); got != img.URL {
			t.Errorf("virtual CD holds %q, want %s", got, img.URL)
		}
		cmds, err := st.Commands(ctx, ids[0], 100)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range cmds {
			if c.Kind != "bmc.media" {
				continue
			}
			found = true
			var a map[string]any
			json.Unmarshal([]byte(c.Args), &a)
			if a["action"] != "insert" || a["url"] != img.URL || a["sha256"] != img.SHA256 || !c.Destructive || !strings.HasPrefix(c.Subject, "bmc:") {
				t.Errorf("bmc.media command %+v args %v", c, a)
			}
		}
		if !found {
			t.Error("no bmc.media command was sent")
		}
		if n := got[ids[1]]; n.State != "failed" || !strings.Contains(n.FaultMsg, "not an iso") {
			t.Errorf("raw image as media: %s %s", n.State, n.FaultMsg)
		}
		if got := media(h.Sim.Machine(ids[1])); got != "" {
			t.Errorf("a refused insert reached the machine: %q", got)
		}
	})
}

func media(m *Machine) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.Media
}

// addBootISO registers a signed catalog ISO "rescue-iso" (sha256: hexByte repeated) and the deploy
// profile "boot-iso" that inserts it, boots from the CD and power-cycles the node.
func addBootISO(t *testing.T, h *Harness, hexByte string) catalog.Image {
	t.Helper()
	ctx := context.Background()
	pub, key, _ := ed25519.GenerateKey(nil)
	if err := h.Metal.AddSigner(ctx, h.Admin, "iso-signer", pub); err != nil {
		t.Fatal(err)
	}
	img := catalog.Image{Name: "rescue-iso", URL: "http://images.sim/rescue.iso", Size: 1 << 20, Format: "iso", Compression: "none",
		SHA256: strings.Repeat(hexByte, 32), Signer: "iso-signer"}
	img.Signature = catalog.Sign(img, key)
	if err := h.Metal.AddImage(ctx, h.Admin, img); err != nil {
		t.Fatal(err)
	}
	if err := h.Metal.PutDeployProfile(ctx, h.Admin, "boot-iso",
		`{"steps":[{"use":"media.insert","args":{"image":"$image"}},{"use":"management.setBootDevice","args":{"device":"cd"}},{"use":"power.cycle"}]}`); err != nil {
		t.Fatal(err)
	}
	return img
}
