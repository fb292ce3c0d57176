package metal

import (
	"context"
	"slices"
	"strings"
	"testing"

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
