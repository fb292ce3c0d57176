package api

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// A reference the call needs, left empty, is invalid_argument naming the field and what it
// takes, and nothing is read or written: not not_found (as if "" were a name looked up).
func TestEmptyRequiredReferencesAreInvalid(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	before, err := e.st.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path, body, want string
	}{
		{"/bcd.v1.InventoryService/UpdatePool", `{"policy":{"hardwareProfile":"redfish"}}`, "pool: is required: the name or id"},
		{"/bcd.v1.InventoryService/DeletePool", `{}`, "pool: is required: the name or id"},
		{"/bcd.v1.InventoryService/DeleteSite", `{}`, "site: is required: the name or id"},
		{"/bcd.v1.NodeService/MacCandidates", `{}`, "site: is required: the name or id"},
		{"/bcd.v1.NodeService/MacCandidates", `{"state":"pending"}`, "site: is required: the name or id"},
		{"/bcd.v1.TokenService/Revoke", `{}`, "token: is required: the name or id"},
		{"/bcd.v1.NodeService/Delete", `{"reason":"x"}`, "node: is required: a node id or name"},
		{"/bcd.v1.BatchService/SetApprovalPolicy", `{"scope":"site","required":1}`, "ref: is required for scope site: the name or id"},
		{"/bcd.v1.BatchService/SetApprovalPolicy", `{"scope":"pool","required":1}`, "ref: is required for scope pool: the name or id"},
		{"/bcd.v1.ImageService/RevokeSigner", `{}`, "name: is required: the name of the registered signer"},
	}
	for _, c := range cases {
		code, body := e.post(t, c.path, e.admin, c.body)
		var r struct{ Code, Message string }
		_ = json.Unmarshal([]byte(body), &r)
		if code != 400 || r.Code != "invalid_argument" || !strings.Contains(r.Message, c.want) {
			t.Errorf("%s %s: %d %s; want invalid_argument %q", c.path, c.body, code, body, c.want)
		}
	}
	if after, _ := e.st.Dump(ctx); before != after {
		t.Fatalf("refused calls changed the store:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
