package metal

import (
	"context"
	"slices"
	"strings"
	"testing"

	"bcd/internal/auth"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// An override of a built-in profile goes through the deploy-profile API path: checked (a bad one
// refused with what may be overridden), stored under the built-in's name, and never a deploy
// profile.
func TestPutBuiltinProfileOverride(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		for _, bad := range []struct{ name, def, want string }{
			{"metal-commission", `{"steps":[{"use":"power.off"}]}`, "is built in: it takes only {\"override\""},
			{"metal-commission", `{"override":{"diag.dcgm":{"args":{"level":"5"}}}}`, "accepted are 0, 1, 2, 3, 4"},
			{"metal-release", `{"override":{"disk.wipe":{"args":{"mode":"quick"}}}}`, "argument mode cannot be overridden: may be overridden in metal-release"},
			{"metal-retire", `{"override":{"metal.revokeIdentity":{}}}`, "step metal.revokeIdentity cannot be overridden"},
		} {
			err := f.svc.PutDeployProfile(ctx, f.admin, bad.name, bad.def)
			if err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("%s %s: %v, want %q", bad.name, bad.def, err, bad.want)
			}
		}
		const off = `{"override":{"diag.dcgm":{"args":{"level":"0"}}}}`
		if err := f.svc.PutDeployProfile(ctx, f.admin, "metal-commission", off); err != nil {
			t.Fatal(err)
		}
		stored, err := f.svc.DeployProfiles(ctx, f.admin)
		if err != nil || stored["metal-commission"] != off {
			t.Fatalf("stored %v %v", stored, err)
		}
		p, err := workflow.ParseProfile("metal-commission", []byte(stored["metal-commission"]))
		dcgm := slices.IndexFunc(p.Steps, func(st workflow.Step) bool { return st.Use == "diag.dcgm" })
		if err != nil || dcgm < 0 || p.Steps[dcgm].When != workflow.WhenOverridden {
			t.Fatalf("stored override reads back as %+v %v", p.Steps, err)
		}
		// A stored override is not a profile a deploy may name, nor listed as one.
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1")); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			complete(t, f, "n1")
		}
		_, _, err = f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: "x", Profile: "metal-commission"})
		if err == nil || !strings.Contains(err.Error(), `unknown deploy profile "metal-commission": defined are default`) || strings.Contains(err.Error(), "default, metal") {
			t.Fatalf("deploy with an override's name: %v", err)
		}
	})
}

// A profile stored through the API can be deleted, except while a node deploying (or failed
// while deploying) names it; deleting a built-in's override makes it run as built.
func TestDeleteDeployProfile(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		gpu := `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},{"use":"boot.kexec"}]}`
		for _, name := range []string{"gpu", "spare"} {
			if err := f.svc.PutDeployProfile(ctx, f.admin, name, gpu); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.svc.PutDeployProfile(ctx, f.admin, "metal-commission", `{"override":{"diag.dcgm":{"args":{"level":"0"}}}}`); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"n1", "n2"} {
			if _, err := f.svc.Enroll(ctx, f.admin, enrollInput(name)); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				complete(t, f, name)
			}
			if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: name, Image: "x", Profile: "gpu"}); err != nil {
				t.Fatal(err)
			}
		}
		// n2's deploy failed: recovering it deploys again with the profile.
		if err := st.Write(ctx, func(tx *store.Tx) error {
			n, err := tx.LockNode(ctx, "n2", "")
			if err != nil {
				return err
			}
			n.State, n.FailedFrom, n.FaultCode = "failed", "deploying", "STEP_FAILED"
			return tx.UpdateNode(ctx, &n)
		}); err != nil {
			t.Fatal(err)
		}
		tenantAdmin := f.admin
		tenantAdmin.TenantID = "t1"
		for _, c := range []struct {
			who  auth.Principal
			name string
			want string
		}{
			{f.admin, "gpu", "nodes deploying or failed while deploying (n1, n2)"},
			{f.admin, "nope", "not found"},
			{f.admin, "", "is required"},
			{f.admin, "bad name!", "name"},
			{tenantAdmin, "spare", "installation-wide"},
		} {
			err := f.svc.DeleteDeployProfile(ctx, c.who, c.name)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("delete %q: %v, want %q", c.name, err, c.want)
			}
		}
		if err := f.svc.DeleteDeployProfile(ctx, f.admin, "spare"); err != nil {
			t.Fatal(err)
		}
		if err := f.svc.DeleteDeployProfile(ctx, f.admin, "metal-commission"); err != nil {
			t.Fatal(err)
		}
		stored, err := f.svc.DeployProfiles(ctx, f.admin)
		if err != nil || len(stored) != 1 || stored["gpu"] == "" {
			t.Fatalf("after deleting: %v %v", stored, err)
		}
		// Once no node needs it (n1 deployed, n2 deploying another way), gpu goes too.
		complete(t, f, "n1")
		if err := st.Write(ctx, func(tx *store.Tx) error {
			n, err := tx.LockNode(ctx, "n2", "")
			if err != nil {
				return err
			}
			n.State, n.FailedFrom = "ready", ""
			return tx.UpdateNode(ctx, &n)
		}); err != nil {
			t.Fatal(err)
		}
		if err := f.svc.DeleteDeployProfile(ctx, f.admin, "gpu"); err != nil {
			t.Fatal(err)
		}
		var deleted int
		events, err := st.Events(ctx, store.EventFilter{Limit: 1000})
		for _, e := range events {
			if e.Kind == "profile.delete" {
				deleted++
			}
		}
		if err != nil || deleted != 3 {
			t.Fatalf("profile.delete events: %d %v, want 3", deleted, err)
		}
	})
}
