package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// On SQLite an attested outcome's signature is checked before the writer from what the server
// handed out (the command's kind) and the reporting node agent's identity, without reading the
// command's row beside the writer; the engine's own check, from the stored row, still decides.
// The kind is kept from the claim until the outcome.
func TestAttestedOutcomeCheckedBeforeTheWriter(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: "disk.wipe", Args: map[string]string{"mode": "quick"}, Timeout: time.Hour}}, nil, Config{})
	ca := f.checkAttestations(t, f.clock.Now())
	f.run(t)
	key, csr, err := pki.NewKeyAndCSR("agent")
	if err != nil {
		t.Fatal(err)
	}
	node := Agent{ID: "node:" + f.node.ID, Kind: "node", NodeID: f.node.ID, Generation: f.node.IdentityGeneration, ConnID: "boot-1"}
	// Valid at the fixture's clock (the store's) and at the wall clock, which the early check
	// uses as a result arrives.
	if node.CertDER, err = ca.IssueNode(csr, node.NodeID, node.Generation, time.Since(f.clock.Now())+24*time.Hour, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Connected(ctx, node, "v"); err != nil {
		t.Fatal(err)
	}
	cmds, err := f.e.Claim(ctx, node, 10)
	if err != nil || len(cmds) != 1 || cmds[0].Kind != "disk.wipe" {
		t.Fatalf("claimed %+v, %v; want the workflow's disk.wipe", cmds, err)
	}
	id := cmds[0].ID
	if err := f.e.Ack(ctx, node, id); err != nil {
		t.Fatal(err)
	}
	result := []byte(`{"devices":[]}`)
	sig, err := pki.SignStatement(key, pki.Statement{CommandID: id, NodeID: f.node.ID, Kind: "disk.wipe", Generation: f.node.IdentityGeneration, ResultSHA256: pki.ResultDigest(result)})
	if err != nil {
		t.Fatal(err)
	}
	honest := Update{CommandID: id, State: "succeeded", Result: result, NodeSig: sig, SignerCertDER: node.CertDER}
	altered := honest
	altered.Result = []byte(`{"devices":[],"forged":true}`)
	unknown := honest
	unknown.CommandID = "0190aaaa-0000-7000-8000-000000000000"
	for _, c := range []struct {
		name    string
		a       Agent
		u       Update
		checked bool
		bad     bool
	}{
		{name: "the honest outcome", a: node, u: honest, checked: true},
		{name: "a result altered after signing", a: node, u: altered, checked: true, bad: true},
		{name: "a command not handed out here", a: node, u: unknown},
		{name: "reported by a site agent", a: f.site, u: honest},
	} {
		checked, err := f.e.preverifyClaimed(ctx, c.a, c.u)
		if checked != c.checked || (err != nil) != c.bad {
			t.Errorf("%s: checked %v, %v; want checked %v, refused %v", c.name, checked, err, c.checked, c.bad)
		}
		if c.bad && !errors.Is(err, pki.ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", c.name, err)
		}
	}
	if err := f.e.Report(ctx, node, Update{CommandID: id, State: "running"}); err != nil {
		t.Fatal(err)
	}
	if _, kept := f.e.attestedKinds.Get(id); !kept {
		t.Error("the kind was dropped on a progress report, before the outcome")
	}
	if err := f.e.Report(ctx, node, honest); err != nil {
		t.Fatal(err)
	}
	if c := f.commands(t, "disk.wipe")[0]; c.State != "succeeded" || string(c.ResultSig) != string(sig) {
		t.Fatalf("after the outcome the wipe is %s (signature kept: %v)", c.State, string(c.ResultSig) == string(sig))
	}
	if checked, _ := f.e.preverifyClaimed(ctx, node, honest); checked {
		t.Error("the kind is still kept after the outcome")
	}
}
