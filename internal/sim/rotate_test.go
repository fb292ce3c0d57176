package sim

import (
	"context"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestBMCCredentialRotation: only a site-signed verified result makes the new version current
// (refs rewritten, the superseded secret deleted); every failure keeps the old credential
// current, keeps the failed version's secret and sets BmcCredentialRotated=False.
func TestBMCCredentialRotation(t *testing.T) {
	cases := []struct {
		fault   string
		ok      bool
		errPart string
	}{
		{"", true, ""},
		{"fail", false, "refused the new password"},
		{"unsigned", false, "not signed by a site agent"},
		{"unverified", false, "did not verify a login"},
		{"forged", false, "signature"},
	}
	for _, c := range cases {
		name := c.fault
		if name == "" {
			name = "verified"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := storetest.Open(t, store.SQLite)
			h, ids := start(t, st, 1)
			rest(t, h, ids)
			before, _ := st.Node(ctx, ids[0], "")
			h.Sim.SetFaults(Faults{Rotate: c.fault})
			res, err := h.Metal.RotateBmcCredential(ctx, h.Admin, ids[0], "quarterly rotation")
			if err != nil {
				t.Fatal(err)
			}
			if res.Version != 2 || res.BatchID != "" {
				t.Fatalf("rotation: %+v", res)
			}
			if _, err := h.Metal.RotateBmcCredential(ctx, h.Admin, ids[0], ""); err == nil {
				t.Fatal("a second rotation was accepted while one is pending")
			}
			var vs []store.CredentialVersion
			waitFor(t, "the rotation's outcome", func() bool {
				vs, _ = st.CredentialVersions(ctx, ids[0])
				return len(vs) == 2 && vs[0].State != store.CredPending
			})
			after, _ := st.Node(ctx, ids[0], "")
			cmd, _ := st.Command(ctx, res.CommandID)
			if strings.Contains(cmd.Args, "sim-password") {
				t.Fatal("the command row holds a password")
			}
			newSecretKept := func(ref string) bool {
				_, err := h.Metal.OpenSecret(ctx, ref)
				return err == nil
			}
			if c.ok {
				if vs[0].State != store.CredCurrent || vs[1].State != store.CredSuperseded {
					t.Fatalf("versions: %s %s (%s)", vs[0].State, vs[1].State, vs[0].Error)
				}
				if after.BMCPasswordRef != vs[0].PasswordRef || after.BMCPasswordRef == before.BMCPasswordRef || after.Conditions["BmcCredentialRotated"] != "True" {
					t.Fatalf("node after a verified rotation: ref %s (new %s) conditions %v", after.BMCPasswordRef, vs[0].PasswordRef, after.Conditions)
				}
				if newSecretKept(before.BMCPasswordRef) || vs[1].PasswordRef != "" {
					t.Fatal("the superseded password secret was kept though no open command names it")
				}
				if !newSecretKept(after.BMCPasswordRef) {
					t.Fatal("the new password secret is gone")
				}
				return
			}
			if vs[0].State != store.CredFailed || vs[1].State != store.CredCurrent || !strings.Contains(vs[0].Error, c.errPart) {
				t.Fatalf("versions: %s %s (%q, want %q)", vs[0].State, vs[1].State, vs[0].Error, c.errPart)
			}
			if after.BMCPasswordRef != before.BMCPasswordRef || after.Conditions["BmcCredentialRotated"] != "False" {
				t.Fatalf("node after a failed rotation: ref changed=%v conditions %v", after.BMCPasswordRef != before.BMCPasswordRef, after.Conditions)
			}
			if !newSecretKept(vs[0].PasswordRef) || !newSecretKept(before.BMCPasswordRef) {
				t.Fatal("a failed rotation lost a secret (the failed version's or the current one's)")
			}
			if !hasEvent(t, st, ids[0], "node.bmc.rotate.failed", res.CommandID) {
				t.Fatal("the failure is not in the event log")
			}
		})
	}
}

// TestRotationUnderApprovals: where approvals are required the rotation waits, held, for its
// one-node batch.
func TestRotationUnderApprovals(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	res, err := h.Metal.RotateBmcCredential(ctx, h.Admin, ids[0], "")
	if err != nil || res.BatchID == "" {
		t.Fatalf("rotation: %+v %v", res, err)
	}
	if cmd, _ := st.Command(ctx, res.CommandID); cmd.State != "held" {
		t.Fatalf("command before approval: %s", cmd.State)
	}
	if _, err := h.Metal.Approve(ctx, alice, res.BatchID, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rotation after approval", func() bool {
		vs, _ := st.CredentialVersions(ctx, ids[0])
		return len(vs) == 2 && vs[0].State == store.CredCurrent
	})
}
