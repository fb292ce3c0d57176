package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestConfigDriveStep: deploy.configDrive of an operator profile reaches the node's ramdisk
// after boot.prepareInstance, naming the node and the SHA-256 of the deploy's user-data (what
// the ramdisk checks the site's documents against), or none when the deploy gave none, and
// the format the profile gives it (none: NoCloud's).
func TestConfigDriveStep(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 2)
		rest(t, h, ids)
		if err := h.Metal.PutDeployProfile(ctx, h.Admin, "drive", `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},`+
			`{"use":"boot.prepareInstance"},{"use":"deploy.configDrive"},{"use":"boot.kexec"}],"cleanup":[{"use":"boot.cleanUp"}]}`); err != nil {
			t.Fatal(err)
		}
		if err := h.Metal.PutDeployProfile(ctx, h.Admin, "drive-openstack", `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},`+
			`{"use":"boot.prepareInstance"},{"use":"deploy.configDrive","args":{"format":"openstack"}},{"use":"boot.kexec"}],"cleanup":[{"use":"boot.cleanUp"}]}`); err != nil {
			t.Fatal(err)
		}
		userData := []byte("#cloud-config\nhostname: n0\n")
		sum := sha256.Sum256(userData)
		if err := h.Apply(ctx, provision.VerbDeploy, ids[:1], metal.VerbInput{Profile: "drive", Image: "img", UserData: userData}); err != nil {
			t.Fatal(err)
		}
		if err := h.Apply(ctx, provision.VerbDeploy, ids[1:], metal.VerbInput{Profile: "drive-openstack", Image: "img"}); err != nil {
			t.Fatal(err)
		}
		got := rest(t, h, ids)
		for i, id := range ids {
			if n := got[id]; n.State != "deployed" {
				t.Fatalf("node %d: %s %s %s", i, n.State, n.FaultCode, n.FaultMsg)
			}
			cmds, err := st.Commands(ctx, id, 100)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			var args map[string]any
			for _, c := range cmds {
				kinds = append(kinds, c.Kind)
				if c.Kind == "deploy.configDrive" {
					if c.State != "succeeded" || !c.Destructive || c.RunsOn != "ramdisk" {
						t.Errorf("node %d: config drive command %+v", i, c)
					}
					json.Unmarshal([]byte(c.Args), &args)
				}
			}
			want, format := "", any("openstack")
			if i == 0 {
				want, format = hex.EncodeToString(sum[:]), nil
			}
			if args == nil || args["nodeId"] != id || args["userDataSha256"] != want || args["format"] != format {
				t.Fatalf("node %d: config drive args %v (commands %v), want nodeId %s, userDataSha256 %q and format %v", i, args, kinds, id, want, format)
			}
			// Oldest first: the drive is written after the instance is prepared and before the
			// kexec.
			order := map[string]int{}
			for j, k := range kinds {
				order[k] = j
			}
			if !(order["boot.prepareInstance"] < order["deploy.configDrive"] && order["deploy.configDrive"] < order["boot.kexec"]) {
				t.Errorf("node %d: commands in the order %v", i, kinds)
			}
		}
	})
}
