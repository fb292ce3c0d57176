package api

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"bcd/internal/catalog"
	"bcd/internal/store"
)

// TestBatchServiceOverHTTP: policy, bulk, self-approval refused with permission_denied, quorum,
// doctor's pending batches, and error codes, through the JSON API.
func TestBatchServiceOverHTTP(t *testing.T) {
	e := newEnv(t)
	for i, mac := range []string{"52:54:00:00:10:01", "52:54:00:00:10:02"} {
		if code, body := e.post(t, enrollPath, e.admin, enrollJSON("b"+string(rune('0'+i)), mac)); code != 200 {
			t.Fatalf("enroll: %d %s", code, body)
		}
	}
	tokenFor := func(name, role string) string {
		code, body := e.post(t, "/bcd.v1.TokenService/Create", e.admin, `{"name":"`+name+`","role":"`+role+`"}`)
		if code != 200 {
			t.Fatalf("token %s: %d %s", name, code, body)
		}
		var r struct{ Secret string }
		json.Unmarshal([]byte(body), &r)
		return r.Secret
	}
	ops, alice := tokenFor("ops", "operator"), tokenFor("alice", "approver")
	const svc = "/bcd.v1.BatchService/"
	if code, body := e.post(t, svc+"SetApprovalPolicy", ops, `{"scope":"pool","ref":"default","required":1}`); code != 403 {
		t.Fatalf("operator set the policy: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"SetApprovalPolicy", e.admin, `{"scope":"rack","ref":"x","required":1}`); code != 400 || !strings.Contains(body, "accepted are installation, site, pool") {
		t.Fatalf("bad scope: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"SetApprovalPolicy", e.admin, `{"scope":"pool","ref":"default","required":1}`); code != 200 {
		t.Fatalf("policy: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"enroll","nodes":["b0"],"reason":"x"}`); code != 400 || !strings.Contains(body, "accepted are manage, inspect, provide, deploy") {
		t.Fatalf("bulk enroll: %d %s", code, body)
	}
	// A bulk deploy's fields reach the service: refused for its missing image, and a count the
	// pool cannot fill is failed_precondition.
	if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"deploy","nodes":["b0"],"reason":"x"}`); code != 400 || !strings.Contains(body, "image: is required") {
		t.Fatalf("bulk deploy without image: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"retire","nodes":["b0"],"count":2,"reason":"x"}`); code != 400 || !strings.Contains(body, "count: applies to deploy only") {
		t.Fatalf("bulk retire with a count: %d %s", code, body)
	}
	// b0 ready (no engine runs here: the row is set by hand); b1 still enrolling; zz unknown.
	err := e.st.Write(t.Context(), func(tx *store.Tx) error {
		n, err := tx.LockNode(t.Context(), "b0", "")
		if err != nil {
			return err
		}
		n.State, n.TargetState, n.ChainVerb = "ready", "", ""
		return tx.UpdateNode(t.Context(), &n)
	})
	if err != nil {
		t.Fatal(err)
	}
	code, body := e.post(t, svc+"Bulk", e.admin, `{"pool":"default","verb":"retire","nodes":["b0","b1","zz"],"reason":"test"}`)
	var res struct {
		Batch struct {
			BatchID  string `json:"batchId"`
			Held     bool
			Required int
			Size     int
		}
		Nodes []struct {
			Name, Error string
			Accepted    bool
		}
	}
	json.Unmarshal([]byte(body), &res)
	if code != 200 || !res.Batch.Held || res.Batch.Required != 1 || res.Batch.Size != 1 || len(res.Nodes) != 3 ||
		!res.Nodes[0].Accepted || !strings.Contains(res.Nodes[1].Error, "retire applies only in") || res.Nodes[2].Error != "no such node in pool default" {
		t.Fatalf("bulk: %d %s", code, body)
	}
	id := res.Batch.BatchID
	if code, body := e.post(t, "/bcd.v1.NodeService/Doctor", alice, `{}`); code != 200 || !strings.Contains(body, `"pendingBatches":[{"id":"`+id) {
		t.Fatalf("doctor: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Approve", e.admin, `{"id":"`+id+`"}`); code != 403 || !strings.Contains(body, "cannot approve it") {
		t.Fatalf("self-approval: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Approve", ops, `{"id":"`+id+`"}`); code != 403 {
		t.Fatalf("operator approval: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Approve", alice, `{"id":"nope"}`); code != 404 {
		t.Fatalf("approve unknown: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Approve", alice, `{"id":"`+id+`","reason":"ok"}`); code != 200 || !strings.Contains(body, `"state":"approved"`) {
		t.Fatalf("approve: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Reject", alice, `{"id":"`+id+`"}`); code != 200 || !strings.Contains(body, `"state":"rejected"`) {
		t.Fatalf("reject after approval (allowed until the batch starts): %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Get", alice, `{"id":"`+id+`"}`); code != 200 || !strings.Contains(body, `"kind":"disk.wipe"`) {
		t.Fatalf("get: %d %s", code, body)
	}

	// b0 ready again (by hand: no engine runs here to apply the rejection): a spread bulk deploy
	// takes it, and the answer counts it under the value of a label it lacks.
	if err := e.st.Write(t.Context(), func(tx *store.Tx) error {
		n, err := tx.LockNode(t.Context(), "b0", "")
		if err != nil {
			return err
		}
		n.State, n.TargetState, n.ChainVerb, n.BatchID = "ready", "", "", ""
		return tx.UpdateNode(t.Context(), &n)
	}); err != nil {
		t.Fatal(err)
	}
	pub, key, _ := ed25519.GenerateKey(nil)
	if code, body := e.post(t, "/bcd.v1.ImageService/AddSigner", e.admin, `{"signer":{"name":"corp","publicKey":"`+base64.StdEncoding.EncodeToString(pub)+`"}}`); code != 200 {
		t.Fatalf("add signer: %d %s", code, body)
	}
	img := catalog.Image{Name: "debian-12", URL: "http://mirror.corp/debian-12.raw", Size: 10, Format: "raw", Compression: "none", SHA256: strings.Repeat("a", 64), Signer: "corp"}
	img.Signature = catalog.Sign(img, key)
	if code, body := e.post(t, "/bcd.v1.ImageService/AddImage", e.admin, imageJSON(img)); code != 200 {
		t.Fatalf("add image: %d %s", code, body)
	}
	// Hardware requirements: b0 has no inventory yet, then 8 GiB.
	for _, c := range []struct {
		require string
		code    int
		want    string
	}{
		{`"memory>=1GiB"`, 400, `"failed_precondition","message":"pool default has 0 nodes that can deploy now matching memory\u003e=1GiB (ready, out of maintenance): 1 were asked for; nothing was deployed; 1 node that can deploy now has no inventory to check (bcd node inspect it)"`},
		{`"ram>=1GiB"`, 400, `"invalid_argument","message":"require: requirement \"ram\u003e=1GiB\": unknown key`},
	} {
		if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"deploy","count":1,"require":[`+c.require+`],"image":"debian-12","reason":"x"}`); code != c.code || !strings.Contains(body, c.want) {
			t.Fatalf("bulk deploy requiring %s: %d %s, want %d with %q", c.require, code, body, c.code, c.want)
		}
	}
	if err := e.st.Write(t.Context(), func(tx *store.Tx) error {
		n, err := tx.LockNode(t.Context(), "b0", "")
		if err != nil {
			return err
		}
		return tx.PutInventory(t.Context(), n.ID, json.RawMessage(`{"memory":{"totalBytes":8589934592}}`))
	}); err != nil {
		t.Fatal(err)
	}
	if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"deploy","count":1,"require":["memory>=16GiB"],"image":"debian-12","reason":"x"}`); code != 400 || !strings.Contains(body, `has 0 nodes that can deploy now matching memory\u003e=16GiB (ready, out of maintenance): 1 were asked for; nothing was deployed"`) {
		t.Fatalf("bulk deploy requiring 16 GiB of an 8 GiB node: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"deploy","count":1,"spread":"rack","require":["memory>=8GiB"],"image":"debian-12","reason":"x"}`); code != 200 || !strings.Contains(body, `"spreadTaken":{"(none)":1}`) {
		t.Fatalf("spread bulk deploy: %d %s", code, body)
	}
	if code, body := e.post(t, svc+"Bulk", ops, `{"pool":"default","verb":"deploy","count":1,"spread":"Rack!","image":"debian-12","reason":"x"}`); code != 400 || !strings.Contains(body, `spread: label key \"Rack!\" is not valid`) {
		t.Fatalf("spread with a bad label key: %d %s", code, body)
	}
}

func TestRenewalOverdue(t *testing.T) {
	const hour = int64(time.Hour / time.Microsecond)
	now := 100 * hour
	for _, tc := range []struct {
		name    string
		renewAt int64
		want    bool
	}{
		{"not known", 0, false},
		{"not due yet", now + hour, false},
		{"due, within the grace", now - hour/2, false},
		{"due for exactly the grace", now - hour, false},
		{"overdue", now - hour - 1, true},
	} {
		if got := renewalOverdue(store.Agent{CertRenewAt: tc.renewAt, CertNotAfter: now + 10*hour}, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
