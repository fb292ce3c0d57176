package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/provision"
	"bcd/internal/sim"
	"bcd/internal/store"
)

const apiUserSecret = "api-UserData-Secret-0c4e"

// Deploy's user_data over JSON: every class of bad input is invalid_argument with what was
// wrong and what is accepted (checked against the guest of the profile the deploy names: the
// built-in default has none); nothing changes on a refusal; an accepted one shows only its
// size and digest, in the answer and in Get; its text is in no answer or log line.
func TestDeployUserDataOverJSON(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	admin := auth.Principal{Name: "test", Role: auth.Admin}
	if err := sim.SeedImages(ctx, e.svc, admin, "img"); err != nil {
		t.Fatal(err)
	}
	for name, guest := range map[string]string{"cloud": "cloud-init", "coreos": "ignition"} {
		def := `{"steps": [{"use": "boot.prepareInstance"}, {"use": "boot.kexec", "args": {"guest": "` + guest + `", "guestSite": "http://10.0.0.1:8080"}}]}`
		if err := e.svc.PutDeployProfile(ctx, admin, name, def); err != nil {
			t.Fatal(err)
		}
	}
	// A config drive with no kexec guest: cloud-init reads the user-data from the drive.
	if err := e.svc.PutDeployProfile(ctx, admin, "drive", `{"steps": [{"use": "boot.prepareInstance"}, {"use": "deploy.configDrive"}, {"use": "boot.kexec"}]}`); err != nil {
		t.Fatal(err)
	}
	site, err := e.st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	pools, err := e.st.Pools(ctx, "", "")
	if err != nil || len(pools) == 0 {
		t.Fatalf("pools %v %v", pools, err)
	}
	n := store.Node{ID: store.NewID(time.Now()), TenantID: site.TenantID, SiteID: site.ID, PoolID: pools[0].ID, Name: "n1",
		State: string(provision.Ready), MACs: []string{"52:54:00:00:00:01"}}
	if err := e.st.Write(ctx, func(tx *store.Tx) error { return tx.InsertNode(ctx, &n) }); err != nil {
		t.Fatal(err)
	}
	deploy := func(profile, userData string) (int, string) {
		b, _ := json.Marshal(map[string]string{"node": "n1", "image": "img", "profile": profile, "userData": base64.StdEncoding.EncodeToString([]byte(userData))})
		return e.post(t, "/bcd.v1.NodeService/Deploy", e.admin, string(b))
	}
	cloudConfig := "#cloud-config\nchpasswd: {users: [{name: ubuntu, password: " + apiUserSecret + "}]}\n"
	cases := []struct {
		name, profile, userData, msg string
	}{
		{"no guest: the default profile", "", cloudConfig, "userData: the deploy profile's boot.kexec has no guest"},
		{"too large", "cloud", "#cloud-config\n" + strings.Repeat("#", 64<<10), "userData: is 65550 bytes: at most 65536"},
		{"no cloud-init header", "cloud", "password: " + apiUserSecret, "does not start with a header cloud-init reads: accepted are #cloud-config, #!, #include"},
		{"cloud-config not YAML", "cloud", "#cloud-config\nkey: [" + apiUserSecret, "is #cloud-config but not valid YAML"},
		{"cloud-config not a mapping", "cloud", "#cloud-config\n- " + apiUserSecret, "not a mapping"},
		{"config drive: cloud-init's rules", "drive", "password: " + apiUserSecret, "does not start with a header cloud-init reads"},
		{"config drive: not Ignition", "drive", `{"ignition": {"version": "3.4.0"}}`, "does not start with a header cloud-init reads"},
		{"ignition not JSON", "coreos", cloudConfig, "is not a JSON object"},
		{"ignition spec 2", "coreos", `{"ignition": {"version": "2.2.0"}, "x": "` + apiUserSecret + `"}`, "accepted are 3.x.y"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := deploy(c.profile, c.userData)
			var got struct{ Code, Message string }
			_ = json.Unmarshal([]byte(body), &got)
			if code != 400 || got.Code != "invalid_argument" || !strings.Contains(got.Message, c.msg) {
				t.Fatalf("%d %s, want 400 invalid_argument with %q", code, body, c.msg)
			}
			if strings.Contains(body, apiUserSecret) {
				t.Fatalf("the refusal quotes the user-data: %s", body)
			}
		})
	}
	if got, _ := e.st.Node(ctx, "n1", ""); got.State != "ready" || got.Version != n.Version {
		t.Fatalf("refusals changed the node: %s v%d", got.State, got.Version)
	}

	code, body := deploy("cloud", cloudConfig)
	sum := sha256.Sum256([]byte(cloudConfig))
	if code != 200 || !strings.Contains(body, `"userDataSha256":"`+hex.EncodeToString(sum[:])+`"`) || !strings.Contains(body, `"userDataSize":"`) {
		t.Fatalf("deploy: %d %s", code, body)
	}
	_, get := e.post(t, "/bcd.v1.NodeService/Get", e.admin, `{"node":"n1"}`)
	_, list := e.post(t, "/bcd.v1.NodeService/List", e.admin, `{}`)
	_, events := e.post(t, "/bcd.v1.NodeService/Events", e.admin, `{"node":"n1"}`)
	for what, text := range map[string]string{"deploy": body, "get": get, "list": list, "events": events, "logs": e.logs.String()} {
		if strings.Contains(text, apiUserSecret) {
			t.Errorf("the user-data appears in %s", what)
		}
	}
	if !strings.Contains(get, hex.EncodeToString(sum[:])) {
		t.Errorf("Get does not show the user-data's digest: %s", get)
	}
}
