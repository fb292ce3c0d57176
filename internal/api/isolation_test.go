package api

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
)

// Another tenant's site agent is not found for a tenant's admin whether or not it was revoked
// already: the answer is the one for an agent that does not exist (before, a revoked one
// answered already_exists, "was revoked already", telling the agent exists).
func TestRevokeSiteAgentOfAnotherTenantAnswersNotFound(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	site := acmeAndSiteDC1(t, e)
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		for _, id := range []string{"agent-live", "agent-gone"} {
			if err := tx.UpsertAgent(ctx, store.Agent{ID: id, Kind: "site", SiteID: site.ID}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if code, body := e.post(t, "/bcd.v1.InventoryService/RevokeSiteAgent", e.admin, `{"agent":"agent-gone","reason":"r"}`); code != 200 {
		t.Fatalf("admin revokes agent-gone: %d %s", code, body)
	}
	acme := e.tokenIn(t, "acme-admin", "admin", "acme")
	answer := func(agent string) (int, string) {
		code, body := e.post(t, "/bcd.v1.InventoryService/RevokeSiteAgent", acme, `{"agent":"`+agent+`","reason":"r"}`)
		var got struct{ Code, Message string }
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("%s: %d %s", agent, code, body)
		}
		return code, got.Code + " " + strings.ReplaceAll(got.Message, agent, "AGENT")
	}
	c0, none := answer("agent-nobody")
	for _, agent := range []string{"agent-live", "agent-gone"} {
		if c, got := answer(agent); c != c0 || got != none {
			t.Errorf("another tenant's %s: %d %s; an unknown agent: %d %s: want the same answer", agent, c, got, c0, none)
		}
	}
	if c0 != 404 {
		t.Errorf("unknown agent: %d %s, want 404", c0, none)
	}
	if revoked, err := e.st.SiteAgentRevoked(ctx, "agent-live"); err != nil || revoked {
		t.Errorf("agent-live revoked by another tenant's admin: %v %v", revoked, err)
	}
}

// fakeJoiner mints site join tokens for the API's tests, recording the TTL asked.
type fakeJoiner struct {
	mu   sync.Mutex
	ttls []time.Duration
}

func (j *fakeJoiner) CreateSiteJoinToken(_ context.Context, _ string, ttl time.Duration) (string, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ttls = append(j.ttls, ttl)
	return "bcdj_test", nil
}

// minted returns the TTLs asked so far.
func (j *fakeJoiner) minted() []time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.ttls)
}
func (j *fakeJoiner) GatewayURL() string { return "https://127.0.0.1:7443" }
func (j *fakeJoiner) CAPEM() []byte      { return nil }

// newEnvWithJoiner is newEnv with an agent gateway (a fake joiner).
func newEnvWithJoiner(t *testing.T) (*env, *fakeJoiner) {
	t.Helper()
	j := &fakeJoiner{}
	return newEnvServing(t, j), j
}

// A join token's ttl_seconds is checked as given: a value whose nanoseconds overflow int64
// (and wrapped into 60 s–7 d before) is refused like any value out of range.
func TestSiteJoinTokenTTLOutOfRangeRefused(t *testing.T) {
	e, j := newEnvWithJoiner(t)
	for _, c := range []struct {
		ttl  string
		code int
		want time.Duration
	}{
		{"0", 200, time.Hour},
		{"60", 200, time.Minute},
		{"604800", 200, 7 * 24 * time.Hour},
		{"59", 400, 0},
		{"604801", 400, 0},
		{"-60", 400, 0},
		{"18446744134", 400, 0},          // ×1e9 wraps to 60.29 s
		{"9223372037", 400, 0},           // ×1e9 overflows to a negative duration
		{"9223372036854775807", 400, 0},  // the largest int64
		{"-9223372036854775808", 400, 0}, // the smallest
	} {
		before := len(j.minted())
		code, body := e.post(t, "/bcd.v1.InventoryService/CreateSiteJoinToken", e.admin, `{"site":"default","ttlSeconds":"`+c.ttl+`"}`)
		if code != c.code {
			t.Errorf("ttl_seconds %s: %d %s, want %d", c.ttl, code, body, c.code)
			continue
		}
		after := j.minted()
		if c.code != 200 {
			if !strings.Contains(body, "ttl_seconds") || !strings.Contains(body, "60 to 604800") || len(after) != before {
				t.Errorf("ttl_seconds %s: %s (minted %d): want it refused naming ttl_seconds and what is accepted, nothing minted", c.ttl, body, len(after)-before)
			}
			continue
		}
		if len(after) != before+1 || after[before] != c.want {
			t.Errorf("ttl_seconds %s: minted with %v, want %v", c.ttl, after[before:], c.want)
		}
	}
}

// Minting a site agent's join token is recorded in the site's tenant's events (who, which
// site, until when; never the token): the agent it lets join receives the site's BMC
// credentials. Before, nothing recorded who minted it.
func TestSiteJoinTokenIsRecorded(t *testing.T) {
	e, _ := newEnvWithJoiner(t)
	for _, b := range []struct{ path, body string }{
		{"/bcd.v1.InventoryService/CreateTenant", `{"name":"acme"}`},
		{"/bcd.v1.InventoryService/CreateSite", `{"name":"acme-dc","tenant":"acme"}`},
	} {
		if code, body := e.post(t, b.path, e.admin, b.body); code != 200 {
			t.Fatalf("%s: %d %s", b.path, code, body)
		}
	}
	admin := e.tokenIn(t, "acme-admin", "admin", "acme")
	viewer := e.tokenIn(t, "acme-viewer", "viewer", "acme")
	code, body := e.post(t, "/bcd.v1.InventoryService/CreateSiteJoinToken", admin, `{"site":"acme-dc","ttlSeconds":"600"}`)
	if code != 200 || !strings.Contains(body, "bcdj_test") {
		t.Fatalf("join token: %d %s", code, body)
	}
	var evs struct {
		Events []struct{ Kind, Actor, Tenant, Data string }
	}
	_, body = e.post(t, "/bcd.v1.NodeService/Events", viewer, `{}`)
	if err := json.Unmarshal([]byte(body), &evs); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range evs.Events {
		if ev.Kind == "site.joinToken.create" {
			found = true
			if ev.Actor != "token:acme-admin" || ev.Tenant != "acme" || !strings.Contains(ev.Data, `"site":"acme-dc"`) || !strings.Contains(ev.Data, `"expiresAt"`) {
				t.Errorf("event %+v: want acme-admin's, in acme, naming the site and the expiry", ev)
			}
		}
	}
	if !found {
		t.Errorf("acme's events hold no site.joinToken.create: %s", body)
	}
	dump, err := e.st.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dump, "bcdj_test") || strings.Contains(e.logs.String(), "bcdj_test") {
		t.Error("the join token is in the store's rows or the logs")
	}
	// Refused requests mint nothing and record nothing.
	if code, _ := e.post(t, "/bcd.v1.InventoryService/CreateSiteJoinToken", viewer, `{"site":"acme-dc"}`); code != 403 {
		t.Errorf("viewer: %d, want 403", code)
	}
}

// Doctor's restore witness is for an admin token without a tenant (as the API reference
// says): a viewer, operator or approver without a tenant is not shown it.
func TestDoctorRestoreWitnessForAdminsOnly(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.WitnessRestore(ctx, store.RestoreWitness{AgentID: "agent-7", Seen: store.Watermark{StoreID: "s", Fences: 1, Beats: 77}, At: 1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role string
		want bool
	}{{"admin", true}, {"operator", false}, {"approver", false}, {"viewer", false}} {
		tok := e.tokenIn(t, "all-"+c.role, c.role, "")
		code, body := e.post(t, "/bcd.v1.NodeService/Doctor", tok, `{}`)
		if code != 200 {
			t.Fatalf("%s: %d %s", c.role, code, body)
		}
		if got := strings.Contains(body, "restoreWitness"); got != c.want {
			t.Errorf("%s without a tenant: restore witness shown %v, want %v: %s", c.role, got, c.want, body)
		}
	}
}
