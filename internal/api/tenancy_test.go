package api

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"bcd/internal/catalog"
	"bcd/internal/store"
)

// tokenIn creates a token (by the installation admin) of role in tenant.
func (e *env) tokenIn(t *testing.T, name, role, tenant string) string {
	t.Helper()
	code, body := e.post(t, "/bcd.v1.TokenService/Create", e.admin, `{"name":"`+name+`","role":"`+role+`","tenant":"`+tenant+`"}`)
	if code != 200 {
		t.Fatalf("token %s: %d %s", name, code, body)
	}
	var r struct{ Secret string }
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	return r.Secret
}

func imageJSON(img catalog.Image) string {
	b, _ := json.Marshal(map[string]any{"image": map[string]any{"name": img.Name, "url": img.URL, "size": img.Size, "format": img.Format,
		"compression": img.Compression, "sha256": img.SHA256, "signer": img.Signer, "signature": base64.StdEncoding.EncodeToString(img.Signature)}})
	return string(b)
}

// What every tenant shares (the image catalog, its signers, deploy profiles, hardware profiles)
// is changed only by an admin token without a tenant: a tenant's admin is refused each, and the
// catalog is as the installation admin left it.
func TestTenantAdminCannotChangeWhatTenantsShare(t *testing.T) {
	e := newEnv(t)
	if code, body := e.post(t, "/bcd.v1.InventoryService/CreateTenant", e.admin, `{"name":"acme"}`); code != 200 {
		t.Fatalf("tenant: %d %s", code, body)
	}
	acme := e.tokenIn(t, "acme-admin", "admin", "acme")
	corpPub, corpKey, _ := ed25519.GenerateKey(nil)
	signer := func(name string, pub ed25519.PublicKey) string {
		return `{"signer":{"name":"` + name + `","publicKey":"` + base64.StdEncoding.EncodeToString(pub) + `"}}`
	}
	if code, body := e.post(t, "/bcd.v1.ImageService/AddSigner", e.admin, signer("corp", corpPub)); code != 200 {
		t.Fatalf("add signer: %d %s", code, body)
	}
	good := catalog.Image{Name: "debian-12", URL: "http://mirror.corp/debian-12.raw", Size: 10, Format: "raw", Compression: "none", SHA256: strings.Repeat("a", 64), Signer: "corp"}
	good.Signature = catalog.Sign(good, corpKey)
	if code, body := e.post(t, "/bcd.v1.ImageService/AddImage", e.admin, imageJSON(good)); code != 200 {
		t.Fatalf("add image: %d %s", code, body)
	}
	evilPub, evilKey, _ := ed25519.GenerateKey(nil)
	evil := catalog.Image{Name: "debian-12", URL: "http://elsewhere.test/implant.raw", Size: 10, Format: "raw", Compression: "none", SHA256: strings.Repeat("b", 64), Signer: "corp"}
	evil.Signature = catalog.Sign(evil, evilKey)
	for _, tc := range []struct{ path, body string }{
		{"/bcd.v1.ImageService/AddSigner", signer("acme-key", evilPub)},
		{"/bcd.v1.ImageService/AddImage", imageJSON(evil)},
		{"/bcd.v1.ImageService/RevokeSigner", `{"name":"corp"}`},
		{"/bcd.v1.InventoryService/PutDeployProfile", `{"profile":{"name":"default","definition":"{\"steps\":[{\"use\":\"metal.ensureRamdisk\"}]}"}}`},
		{"/bcd.v1.InventoryService/PutHardwareProfile", `{"profile":{"name":"x","drivers":{"power":"ipmi"}}}`},
		{"/bcd.v1.InventoryService/DeleteDeployProfile", `{"name":"default"}`},
	} {
		code, body := e.post(t, tc.path, acme, tc.body)
		if code != 403 || !strings.Contains(body, "installation-wide") {
			t.Errorf("%s by a tenant's admin: %d %s, want 403 naming what is installation-wide", tc.path, code, body)
		}
	}
	img, err := e.st.VerifiedImage(context.Background(), "debian-12")
	if err != nil || img.URL != good.URL || img.Signer != "corp" {
		t.Fatalf("debian-12 after the tenant admin's attempts: %s by %s (%v)", img.URL, img.Signer, err)
	}
	profiles, err := e.st.Profiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := profiles["default"]; ok {
		t.Fatalf("the default deploy profile was replaced: %v", profiles)
	}
}

// A tenant's viewer sees, in doctor and the approvals policies, only its own sites' agents
// and policies (and the installation's policy), and no servers; a filter naming another
// tenant's site or pool answers as for a name that does not exist.
func TestTenantSeesOnlyItsOwnSitesAgentsAndPolicies(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	for _, b := range []struct{ path, body string }{
		{"/bcd.v1.InventoryService/CreateTenant", `{"name":"acme"}`},
		{"/bcd.v1.InventoryService/CreateSite", `{"name":"other-dc","tenant":"default"}`},
		{"/bcd.v1.InventoryService/CreateSite", `{"name":"acme-dc","tenant":"acme"}`},
		{"/bcd.v1.InventoryService/CreatePool", `{"name":"other-pool","site":"other-dc","policy":{"hardwareProfile":"redfish"}}`},
		{"/bcd.v1.BatchService/SetApprovalPolicy", `{"scope":"site","ref":"other-dc","required":2}`},
		{"/bcd.v1.BatchService/SetApprovalPolicy", `{"scope":"site","ref":"acme-dc","required":1}`},
		{"/bcd.v1.BatchService/SetApprovalPolicy", `{"scope":"installation","required":1}`},
	} {
		if code, body := e.post(t, b.path, e.admin, b.body); code != 200 {
			t.Fatalf("%s %s: %d %s", b.path, b.body, code, body)
		}
	}
	other, err := e.st.Site(ctx, "other-dc")
	if err != nil {
		t.Fatal(err)
	}
	own, err := e.st.Site(ctx, "acme-dc")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.ServerAlive(ctx, "server-1", 0); err != nil {
			return err
		}
		if err := tx.UpsertAgent(ctx, store.Agent{ID: "other-agent", Kind: "site", SiteID: other.ID, Version: "v1"}); err != nil {
			return err
		}
		if err := tx.UpsertAgent(ctx, store.Agent{ID: "acme-agent", Kind: "site", SiteID: own.ID, Version: "v1"}); err != nil {
			return err
		}
		// A command waiting for each site's agents: each site's queue is its tenant's to see.
		for _, site := range []string{other.ID, own.ID} {
			if err := tx.InsertCommand(ctx, &store.Command{SiteID: site, Kind: "bmc.power", Subject: "n", Args: "{}", RunsOn: "site"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	viewer := e.tokenIn(t, "acme-viewer", "viewer", "acme")

	_, body := e.post(t, "/bcd.v1.NodeService/Doctor", viewer, `{}`)
	flat := strings.ReplaceAll(body, " ", "")
	if strings.Contains(body, "other-agent") || !strings.Contains(body, "acme-agent") || strings.Contains(body, "server-1") ||
		!strings.Contains(flat, `"queues":[{"site":"acme-dc","runsOn":"site","commands":"1"`) || strings.Contains(body, `"site":"other-dc"`) {
		t.Errorf("tenant doctor: %s: want acme's agent and queue only, no servers", body)
	}
	if _, body := e.post(t, "/bcd.v1.NodeService/Doctor", e.admin, `{}`); !strings.Contains(body, "other-agent") || !strings.Contains(body, "server-1") || strings.Contains(body, "restoreWitness") ||
		strings.Count(body, `"runsOn"`) != 2 {
		t.Errorf("installation doctor: %s: want every agent, both sites' queues and the servers, no restore witness", body)
	}
	// An agent witnessed a restore: the installation's doctor says so, a tenant's does not.
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.WitnessRestore(ctx, store.RestoreWitness{AgentID: "other-agent", Seen: store.Watermark{StoreID: "s", Fences: 1, Beats: 77}, At: 1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// protojson varies its spacing from run to run: compare without it.
	if _, body := e.post(t, "/bcd.v1.NodeService/Doctor", e.admin, `{}`); !strings.Contains(strings.ReplaceAll(body, " ", ""), `"restoreWitness":{"agentId":"other-agent","seenFences":"1","seenBeats":"77"`) {
		t.Errorf("installation doctor after a witness: %s", body)
	}
	if _, body := e.post(t, "/bcd.v1.NodeService/Doctor", viewer, `{}`); strings.Contains(body, "restoreWitness") {
		t.Errorf("tenant doctor after a witness: %s", body)
	}
	_, body = e.post(t, "/bcd.v1.BatchService/ListApprovalPolicies", viewer, `{}`)
	if strings.Contains(body, other.ID) || !strings.Contains(body, own.ID) || !strings.Contains(body, `"installation"`) {
		t.Errorf("tenant policies: %s: want the installation's and acme-dc's only", body)
	}
	for _, tc := range []struct{ path, theirs, none string }{
		{"/bcd.v1.NodeService/List", `{"site":"other-dc"}`, `{"site":"no-such-dc"}`},
		{"/bcd.v1.NodeService/List", `{"pool":"other-pool"}`, `{"pool":"no-such-pool"}`},
		{"/bcd.v1.InventoryService/ListPools", `{"site":"other-dc"}`, `{"site":"no-such-dc"}`},
	} {
		c1, b1 := e.post(t, tc.path, viewer, tc.theirs)
		c2, b2 := e.post(t, tc.path, viewer, tc.none)
		if c1 != c2 || c1 == 200 || strings.ReplaceAll(b1, "other", "no-such") != b2 {
			t.Errorf("%s: another tenant's %s → %d %s; a missing one %s → %d %s: want the same answer", tc.path, tc.theirs, c1, b1, tc.none, c2, b2)
		}
	}
}

// More label selectors than a node has labels are refused with invalid_argument (before, ~1000
// nested the store's query past SQLite's depth: an internal error); a value of the wrong type
// in a request is not quoted back in the error.
func TestSelectorsBoundedAndValuesNotEchoed(t *testing.T) {
	e := newEnv(t)
	sels := make([]string, 65)
	for i := range sels {
		sels[i] = fmt.Sprintf(`"k%d=v"`, i)
	}
	for _, tc := range []struct{ path, body string }{
		{"/bcd.v1.NodeService/List", `{"labels":[` + strings.Join(sels, ",") + `]}`},
		{"/bcd.v1.BatchService/Bulk", `{"verb":"inspect","pool":"default","reason":"r","selectors":[` + strings.Join(sels, ",") + `]}`},
	} {
		code, body := e.post(t, tc.path, e.admin, tc.body)
		if code != 400 || !strings.Contains(body, "65 selectors: at most 64") {
			t.Errorf("%s with 65 selectors: %d %s", tc.path, code, body)
		}
	}
	if code, body := e.post(t, "/bcd.v1.NodeService/List", e.admin, `{"labels":[`+strings.Join(sels[:64], ",")+`]}`); code != 200 {
		t.Errorf("64 selectors: %d %s", code, body)
	}
	code, body := e.post(t, "/bcd.v1.NodeService/Enroll", e.admin, `{"name":"n","pool":"default","bmc":{"address":"https://10.0.0.9","username":"root","password":98765432123}}`)
	if code != 400 || strings.Contains(body, "98765432123") || !strings.Contains(body, "password") {
		t.Errorf("a numeric password: %d %s: want 400 naming the field, not its value", code, body)
	}
}

// acmeAndSiteDC1 creates tenant acme and site dc1 of the default tenant, and returns the site.
func acmeAndSiteDC1(t *testing.T, e *env) store.Site {
	t.Helper()
	for _, b := range []struct{ path, body string }{
		{"/bcd.v1.InventoryService/CreateTenant", `{"name":"acme"}`},
		{"/bcd.v1.InventoryService/CreateSite", `{"name":"dc1","tenant":"default"}`},
	} {
		if code, body := e.post(t, b.path, e.admin, b.body); code != 200 {
			t.Fatalf("%s: %d %s", b.path, code, body)
		}
	}
	site, err := e.st.Site(context.Background(), "dc1")
	if err != nil {
		t.Fatal(err)
	}
	return site
}

// RevokeSiteAgent: an admin revokes a site agent (recorded, with an event); again is a
// conflict; another tenant's admin and an unknown agent get not_found; a viewer is refused.
func TestRevokeSiteAgent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	site := acmeAndSiteDC1(t, e)
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		return tx.UpsertAgent(ctx, store.Agent{ID: "agent-1", Kind: "site", SiteID: site.ID})
	}); err != nil {
		t.Fatal(err)
	}
	acme := e.tokenIn(t, "acme-admin", "admin", "acme")
	viewer := e.tokenIn(t, "viewer", "viewer", "")
	for _, tc := range []struct {
		name, token, agent string
		code               int
	}{
		{"viewer", viewer, "agent-1", 403},
		{"another tenant's admin", acme, "agent-1", 404},
		{"unknown agent", e.admin, "nobody", 404},
		{"admin", e.admin, "agent-1", 200},
		{"again", e.admin, "agent-1", 409},
	} {
		code, body := e.post(t, "/bcd.v1.InventoryService/RevokeSiteAgent", tc.token, `{"agent":"`+tc.agent+`","reason":"host decommissioned"}`)
		if code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.code)
		}
	}
	if revoked, err := e.st.SiteAgentRevoked(ctx, "agent-1"); err != nil || !revoked {
		t.Fatalf("agent-1 revoked: %v %v", revoked, err)
	}
	evs, err := e.st.Events(ctx, store.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Kind == "site.agent.revoke" {
			n++
			if ev.Reason != "host decommissioned" || !strings.Contains(ev.Data, "agent-1") {
				t.Errorf("event %+v", ev)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d site.agent.revoke events, want 1", n)
	}
}
