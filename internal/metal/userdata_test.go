package metal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// userSecret is a token in user-data that must never leave the sealed secret.
const userSecret = "ud-Tok3n-never-shown-9f2c"

var (
	goodCloudConfig = "#cloud-config\nssh_authorized_keys: [\"ssh-ed25519 AAAA " + userSecret + "\"]\n"
	goodIgnition    = `{"ignition": {"version": "3.3.0"}, "passwd": {"users": [{"name": "core", "passwordHash": "` + userSecret + `"}]}}`
)

// TestCheckUserData: each class of bad user-data is refused with what is wrong and what is
// accepted, never quoting the data; what cloud-init and Ignition read passes.
func TestCheckUserData(t *testing.T) {
	cases := []struct {
		name, guest, data string
		want              string // substring of the error; "" accepts
	}{
		{"cloud-config", GuestCloudInit, goodCloudConfig, ""},
		{"cloud-config empty mapping", GuestCloudInit, "#cloud-config\n{}\n", ""},
		{"cloud-config comment only", GuestCloudInit, "#cloud-config\n# nothing yet\n", ""},
		{"shell script", GuestCloudInit, "#!/bin/sh\necho " + userSecret + "\n", ""},
		{"include", GuestCloudInit, "#include\nhttp://10.0.0.1/ud\n", ""},
		{"boothook", GuestCloudInit, "#cloud-boothook\n#!/bin/sh\ntrue\n", ""},
		{"jinja", GuestCloudInit, "## template: jinja\n#cloud-config\nhostname: {{ v1.instance_id }}\n", ""},
		{"mime multipart", GuestCloudInit, "Content-Type: multipart/mixed; boundary=\"x\"\nMIME-Version: 1.0\n\n--x\n", ""},
		{"ignition 3.0", GuestIgnition, `{"ignition":{"version":"3.0.0"}}`, ""},
		{"ignition 3.3", GuestIgnition, goodIgnition, ""},

		{"too large", GuestCloudInit, "#cloud-config\n" + strings.Repeat("#", MaxUserData), "at most 65536"},
		{"no header", GuestCloudInit, "users: [" + userSecret + "]\n", "does not start with a header cloud-init reads: accepted are #cloud-config"},
		{"leading space", GuestCloudInit, " #cloud-config\n{}\n", "does not start with a header"},
		{"not utf-8 (gzip)", GuestCloudInit, "\x1f\x8b\x08\x00" + userSecret, "not UTF-8 text"},
		{"cloud-config bad yaml", GuestCloudInit, "#cloud-config\nusers: [" + userSecret + "\n  - : :\n", "not valid YAML"},
		{"cloud-config a list", GuestCloudInit, "#cloud-config\n- " + userSecret + "\n", "is a list, not a mapping"},
		{"cloud-config a string", GuestCloudInit, "#cloud-config\n" + userSecret + "\n", "is a string, not a mapping"},
		{"ignition not json", GuestIgnition, "#cloud-config\n{}\n", "not a JSON object"},
		{"ignition an array", GuestIgnition, `["` + userSecret + `"]`, "not a JSON object"},
		{"ignition no version", GuestIgnition, `{"passwd": {"users": []}}`, "has no ignition object with a version"},
		{"ignition spec 2", GuestIgnition, `{"ignition":{"version":"2.3.0"}}`, "not a spec 3 version: accepted are 3.x.y"},
		{"no guest", "", goodCloudConfig, "has no guest"},
		{"guest none", "none", goodCloudConfig, "has no guest"},
		{"unknown guest", "talos", goodCloudConfig, "reads no user-data: accepted are guests cloud-init and ignition"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckUserData(c.guest, []byte(c.data))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one containing %q", err, c.want)
			case err != nil && strings.Contains(err.Error(), userSecret):
				t.Fatalf("the error quotes the user-data: %v", err)
			}
			var inv *InvalidError
			if err != nil && (!errors.As(err, &inv) || inv.Field != "userData") {
				t.Fatalf("error %T %v is not an invalid userData", err, err)
			}
		})
	}
}

func putProfile(t *testing.T, f *fixture, name, guest string) {
	t.Helper()
	def := `{"steps": [{"use": "metal.ensureRamdisk"}, {"use": "deploy.image", "args": {"image": "$image"}},
		{"use": "boot.prepareInstance"}, {"use": "boot.kexec", "args": {"guest": "` + guest + `", "guestSite": "http://10.0.0.1:8080"}}],
		"cleanup": [{"use": "boot.cleanUp"}]}`
	if err := f.svc.PutDeployProfile(context.Background(), f.admin, name, def); err != nil {
		t.Fatal(err)
	}
}

func readyNode(t *testing.T, f *fixture, name string) store.Node {
	t.Helper()
	if _, err := f.svc.Enroll(context.Background(), f.admin, enrollInput(name)); err != nil {
		t.Fatal(err)
	}
	var n store.Node
	for range 3 {
		n = complete(t, f, name)
	}
	if n.State != "ready" {
		t.Fatalf("node %s is %s, want ready", name, n.State)
	}
	return n
}

// TestDeployUserData: the deploy verb checks user-data against its profile's guest (the
// built-in default has none and refuses it; a refused deploy changes nothing), seals what it
// accepts and keeps only the reference, size and digest on the node; a second deploy replaces
// it and deletes the first secret. The text never appears in the node, list, events, logs,
// errors, nor in the database outside the sealed secret.
func TestDeployUserData(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		putProfile(t, f, "cloud", GuestCloudInit)
		putProfile(t, f, "coreos", GuestIgnition)
		n := readyNode(t, f, "n1")
		secretsBefore, err := st.SecretCount(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var errs []string
		refused := []struct {
			name, profile, data, want string
		}{
			{"no guest (default profile)", "", goodCloudConfig, "no guest"},
			{"ignition for a cloud-init guest", "cloud", goodIgnition, "does not start with a header cloud-init reads"},
			{"cloud-config for an ignition guest", "coreos", goodCloudConfig, "not a JSON object"},
			{"too large", "cloud", "#cloud-config\n" + strings.Repeat("#", MaxUserData), "at most"},
		}
		for _, c := range refused {
			_, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: "debian", Profile: c.profile, UserData: []byte(c.data)})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s: %v, want %q", c.name, err, c.want)
			}
			errs = append(errs, err.Error())
		}
		if got, _ := st.Node(ctx, "n1", ""); got.State != "ready" || got.UserDataRef != "" || got.Version != n.Version {
			t.Fatalf("refused deploys changed the node: %s ref %q version %d (was %d)", got.State, got.UserDataRef, got.Version, n.Version)
		}
		if c, _ := st.SecretCount(ctx); c != secretsBefore {
			t.Fatalf("refused deploys left %d secrets, want %d", c, secretsBefore)
		}

		deploy := func(profile, data string) store.Node {
			t.Helper()
			got, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: "debian", Profile: profile, UserData: []byte(data)})
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256([]byte(data))
			if got.UserDataSHA256 != hex.EncodeToString(sum[:]) || got.UserDataSize != int64(len(data)) || !strings.HasPrefix(got.UserDataRef, "secret://") {
				t.Fatalf("node after deploy: ref %q sha %q size %d", got.UserDataRef, got.UserDataSHA256, got.UserDataSize)
			}
			plain, err := f.svc.OpenSecret(ctx, got.UserDataRef)
			if err != nil || string(plain) != data {
				t.Fatalf("the sealed user-data opens to %d bytes (%v), want the deploy's", len(plain), err)
			}
			return got
		}
		first := deploy("cloud", goodCloudConfig)
		evs, err := f.svc.Events(ctx, f.admin, first.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if e := evs[len(evs)-1]; e.Kind != "node.deploy" || !strings.Contains(e.Data, `"userDataSha256":"`+first.UserDataSHA256+`"`) ||
			!strings.Contains(e.Data, fmt.Sprintf(`"userDataSize":%d`, len(goodCloudConfig))) {
			t.Fatalf("deploy event %s %s: want the user-data's size and digest", e.Kind, e.Data)
		}

		// Back to ready as the test's chain moves it (the engine's release is tested in
		// netboot's end-to-end test), then a new deploy replaces the user-data.
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbAbort, VerbInput{Node: "n1"}); err != nil {
			t.Fatal(err)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			n, err := tx.LockNode(ctx, "n1", "")
			if err != nil {
				return err
			}
			n.State, n.TargetState, n.Maintenance, n.FailedFrom, n.FaultCode = "ready", "", false, "", ""
			return tx.UpdateNode(ctx, &n)
		}); err != nil {
			t.Fatal(err)
		}
		second := deploy("coreos", goodIgnition)
		if _, err := f.svc.OpenSecret(ctx, first.UserDataRef); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the replaced user-data's secret: %v, want it deleted", err)
		}
		if c, _ := st.SecretCount(ctx); c != secretsBefore+1 {
			t.Fatalf("%d secrets after the replacement, want %d", c, secretsBefore+1)
		}

		got, _ := f.svc.Get(ctx, f.admin, "n1")
		list, _, _ := f.svc.List(ctx, f.admin, ListInput{})
		all, _ := f.svc.Events(ctx, f.admin, "", 0, 0)
		dump, err := st.Dump(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for what, text := range map[string]string{"node": fmt.Sprintf("%+v", got), "list": fmt.Sprintf("%+v", list), "events": fmt.Sprintf("%+v", all),
			"logs": f.logs.String(), "errors": strings.Join(errs, "\n"), "database": dump} {
			if strings.Contains(text, userSecret) {
				t.Errorf("the user-data appears in the %s", what)
			}
		}
		if got.UserDataRef != second.UserDataRef {
			t.Errorf("node's user-data %q, want %q", got.UserDataRef, second.UserDataRef)
		}
	})
}
