package metal

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"bcd/internal/auth"
	"bcd/internal/catalog"
	"bcd/internal/provision"
	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

const secretPassword = "S3cr3t-Pa55word-do-not-leak"

type fixture struct {
	svc   *Service
	st    *store.Store
	admin auth.Principal
	logs  *bytes.Buffer
}

func newFixture(t *testing.T, st *store.Store) *fixture {
	t.Helper()
	sealer, err := secrets.NewSealer(bytes.Repeat([]byte{1}, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	logs := &bytes.Buffer{}
	svc := New(st, sealer, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	tok, err := svc.Bootstrap(context.Background())
	if err != nil || !strings.HasPrefix(tok, auth.TokenPrefix) {
		t.Fatalf("bootstrap: %q %v", tok, err)
	}
	again, err := svc.Bootstrap(context.Background())
	if err != nil || again != "" {
		t.Fatalf("second bootstrap must not mint a token: %q %v", again, err)
	}
	p, err := svc.Authenticate(context.Background(), tok)
	if err != nil || p.Role != auth.Admin {
		t.Fatalf("authenticating the first token: %+v %v", p, err)
	}
	pub, key, _ := ed25519.GenerateKey(nil)
	if err := svc.AddSigner(context.Background(), p, "test-signer", pub); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"debian", "debian-12", "x"} {
		img := catalog.Image{Name: name, URL: "http://images.test/" + name, Size: 10, Format: "raw", Compression: "none", SHA256: strings.Repeat("a", 64), Signer: "test-signer"}
		img.Signature = catalog.Sign(img, key)
		if err := svc.AddImage(context.Background(), p, img); err != nil {
			t.Fatal(err)
		}
	}
	return &fixture{svc: svc, st: st, admin: p, logs: logs}
}

func enrollInput(name string, macs ...string) EnrollInput {
	return EnrollInput{Name: name, Pool: "default", MACs: macs, Labels: map[string]string{"rack": "r1"},
		BMC: BMCInput{Address: "https://10.0.0.5", Username: "root", Password: secretPassword}}
}

func TestEnrollAndVerbs(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		n, err := f.svc.Enroll(ctx, f.admin, enrollInput("node-1", "52:54:00:AA:BB:01"))
		if err != nil {
			t.Fatal(err)
		}
		if n.State != "enrolling" || n.TargetState != "ready" || n.ChainVerb != "enroll" || n.MACs[0] != "52:54:00:aa:bb:01" || n.Drivers["power"] != "redfish" {
			t.Fatalf("enrolled node: %+v", n)
		}
		if !strings.HasPrefix(n.BMCPasswordRef, "secret://") || !strings.HasPrefix(n.BMCUsernameRef, "secret://") {
			t.Fatalf("credentials not referenced: %q %q", n.BMCUsernameRef, n.BMCPasswordRef)
		}
		wakes, _ := st.WakeUps(ctx, 10)
		if len(wakes) != 1 || wakes[0].NodeID != n.ID || wakes[0].Reason != "enroll" {
			t.Fatalf("wake-ups after enroll: %+v", wakes)
		}
		// The sealed password opens to the original with the service's key.
		id, _ := secrets.ParseRef(n.BMCPasswordRef)
		sealed, err := st.Sealed(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if pw, err := f.svc.sealer.Open(id, sealed); err != nil || string(pw) != secretPassword {
			t.Fatalf("sealed password does not open: %v", err)
		}

		// Verbs refused while enrolling name the state and what is accepted.
		_, _, err = f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "node-1", Image: "debian"})
		var re *provision.RefusedError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "node is enrolling") || !strings.Contains(err.Error(), "abort") {
			t.Fatalf("deploy while enrolling: %v", err)
		}
		// Power is refused while a workflow controls the node.
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbPower, VerbInput{Node: "node-1", PowerAction: "on"}); !errors.As(err, &re) {
			t.Fatalf("power while enrolling: %v", err)
		}
		// Abort: failed, failed_from, maintenance on, fault ABORTED, wake-up.
		n, _, err = f.svc.Apply(ctx, f.admin, provision.VerbAbort, VerbInput{Node: n.ID, Reason: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if n.State != "failed" || n.FailedFrom != "enrolling" || !n.Maintenance || n.FaultCode != "ABORTED" {
			t.Fatalf("after abort: %+v", n)
		}
		// Recover clears the fault and goes back to enrolling.
		n, _, err = f.svc.Apply(ctx, f.admin, provision.VerbRecover, VerbInput{Node: n.ID})
		if err != nil {
			t.Fatal(err)
		}
		if n.State != "enrolling" || n.Maintenance || n.FaultCode != "" || n.TargetState != "ready" {
			t.Fatalf("after recover: %+v", n)
		}
		// Expected version mismatch changes nothing.
		_, _, err = f.svc.Apply(ctx, f.admin, provision.VerbAbort, VerbInput{Node: n.ID, ExpectedVersion: n.Version - 1})
		var se *StaleError
		if !errors.As(err, &se) {
			t.Fatalf("stale version: %v", err)
		}
		evs, err := f.svc.Events(ctx, f.admin, "node-1", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, e.Kind+":"+e.FromState+">"+e.ToState)
		}
		if got, want := strings.Join(kinds, " "), "node.enroll:>enrolling node.abort:enrolling>failed node.recover:failed>enrolling"; got != want {
			t.Fatalf("events %q, want %q", got, want)
		}
	})
}

// walk drives a node through states by writing the moves the reconciler will make (complete),
// so the verbs of resting states can be tested before the engine exists.
func complete(t *testing.T, f *fixture, ref string) store.Node {
	t.Helper()
	ctx := context.Background()
	var out store.Node
	err := f.st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, ref, "")
		if err != nil {
			return err
		}
		next, target, err := provision.Complete(provision.State(n.State), provision.State(n.TargetState), provision.Verb(n.ChainVerb))
		if err != nil {
			return err
		}
		n.State, n.TargetState = string(next), string(target)
		if err := tx.UpdateNode(ctx, &n); err != nil {
			return err
		}
		out = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestLifecycleVerbs(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1")); err != nil {
			t.Fatal(err)
		}
		gpu := `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},{"use":"boot.kexec"}]}`
		if err := f.svc.PutDeployProfile(ctx, f.admin, "gpu", gpu); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: "x", Profile: "nope"}); err == nil || !strings.Contains(err.Error(), "defined are default, gpu") {
			t.Fatalf("unknown profile: %v", err)
		}
		for _, want := range []string{"inspecting", "commissioning", "ready"} {
			if n := complete(t, f, "n1"); n.State != want {
				t.Fatalf("chain: %s, want %s", n.State, want)
			}
		}
		steps := []struct {
			verb  provision.Verb
			in    VerbInput
			state string
		}{
			{provision.VerbManage, VerbInput{}, "manageable"},
			{provision.VerbInspect, VerbInput{}, "inspecting"},
			{"", VerbInput{}, "manageable"}, // complete: inspect returns where it began
			{provision.VerbProvide, VerbInput{}, "commissioning"},
			{"", VerbInput{}, "ready"},
			{provision.VerbDeploy, VerbInput{Image: "debian-12", Profile: "gpu"}, "deploying"},
			{"", VerbInput{}, "deployed"},
			{provision.VerbRescue, VerbInput{}, "rescue"},
			{"", VerbInput{}, "rescue"},
			{provision.VerbUnrescue, VerbInput{}, "rescue"},
			{"", VerbInput{}, "deployed"},
			{provision.VerbUndeploy, VerbInput{Wipe: "full"}, "releasing"},
			{"", VerbInput{}, "ready"},
			{provision.VerbRetire, VerbInput{}, "retiring"},
			{"", VerbInput{}, "retired"},
		}
		for i, s := range steps {
			var n store.Node
			if s.verb == "" {
				n = complete(t, f, "n1")
			} else {
				s.in.Node = "n1"
				var err error
				if n, _, err = f.svc.Apply(ctx, f.admin, s.verb, s.in); err != nil {
					t.Fatalf("step %d %s: %v", i, s.verb, err)
				}
			}
			if n.State != s.state {
				t.Fatalf("step %d %s: state %s, want %s", i, s.verb, n.State, s.state)
			}
			if s.verb == provision.VerbDeploy && (n.DeployImage != "debian-12" || n.DeployProfile != "gpu") {
				t.Fatalf("deploy arguments not recorded: %+v", n)
			}
			if s.verb == provision.VerbUndeploy && n.WipeMode != "full" {
				t.Fatalf("wipe mode not recorded: %+v", n)
			}
		}
		// Power in a resting state queues a bmc.power command and an event; state unchanged.
		n, cmd, err := f.svc.Apply(ctx, f.admin, provision.VerbPower, VerbInput{Node: "n1", PowerAction: "off"})
		if err != nil || cmd == "" || n.State != "retired" {
			t.Fatalf("power: %v %q %+v", err, cmd, n)
		}
		// Maintenance on blocks verbs; off wakes the reconciler.
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbMaintenance, VerbInput{Node: "n1", MaintenanceOn: true, Reason: "fan"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbMaintenance, VerbInput{Node: "n1", MaintenanceOn: true}); err == nil {
			t.Fatal("maintenance on twice accepted")
		}
		if err := f.svc.Delete(ctx, f.admin, "n1", "gone"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.Get(ctx, f.admin, "n1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		// Its secrets are gone with it; its events stay.
		dump, _ := st.Dump(ctx)
		if strings.Contains(dump, "secrets:") {
			t.Fatalf("secrets left after delete:\n%s", dump)
		}
		evs, _ := f.svc.Events(ctx, f.admin, "", 0, 0)
		if evs[len(evs)-1].Kind != "node.delete" {
			t.Fatalf("last event %s", evs[len(evs)-1].Kind)
		}
	})
}

func TestBadInputChangesNothing(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("taken", "52:54:00:00:00:01")); err != nil {
			t.Fatal(err)
		}
		before, _ := st.Dump(ctx)
		mod := func(m func(*EnrollInput)) EnrollInput {
			in := enrollInput("fresh", "52:54:00:00:00:02")
			m(&in)
			return in
		}
		cases := []struct {
			name string
			in   EnrollInput
			want string
		}{
			{"empty name", mod(func(i *EnrollInput) { i.Name = "" }), "name: is required"},
			{"bad name", mod(func(i *EnrollInput) { i.Name = "Node 1" }), "not a valid name"},
			{"no pool", mod(func(i *EnrollInput) { i.Pool = "" }), "pool: is required"},
			{"unknown pool", mod(func(i *EnrollInput) { i.Pool = "nope" }), "not found"},
			{"bad mac", mod(func(i *EnrollInput) { i.MACs = []string{"52:54:00:zz:00:01"} }), "not an Ethernet MAC"},
			{"multicast mac", mod(func(i *EnrollInput) { i.MACs = []string{"01:00:5e:00:00:01"} }), "multicast"},
			{"mac twice", mod(func(i *EnrollInput) { i.MACs = []string{"52:54:00:00:00:09", "52-54-00-00-00-09"} }), "listed twice"},
			{"mac of another node", mod(func(i *EnrollInput) { i.MACs = []string{"52:54:00:00:00:01"} }), "already belongs"},
			{"duplicate name", mod(func(i *EnrollInput) { i.Name = "taken" }), "already exists"},
			{"bad uuid", mod(func(i *EnrollInput) { i.ProductUUID = "1234" }), "not a UUID"},
			{"bad url", mod(func(i *EnrollInput) { i.BMC.Address = "ftp://x" }), "not a Redfish service address"},
			{"url with path", mod(func(i *EnrollInput) { i.BMC.Address = "https://x/redfish/v1" }), "without path"},
			{"ipmi scheme", mod(func(i *EnrollInput) { i.BMC.Driver = "ipmi"; i.BMC.Address = "https://x" }), "without a scheme"},
			{"bad port", mod(func(i *EnrollInput) { i.BMC.Driver = "ipmi"; i.BMC.Address = "10.0.0.1:99999" }), "not in 1-65535"},
			{"unknown driver", mod(func(i *EnrollInput) { i.BMC.Driver = "acme" }), "accepted are redfish, ipmi"},
			{"no password", mod(func(i *EnrollInput) { i.BMC.Password = "" }), "bmc.password: is required"},
			{"control char", mod(func(i *EnrollInput) { i.BMC.Password = "a\x00b" }), "control character"},
			{"bad label", mod(func(i *EnrollInput) { i.Labels = map[string]string{"Bad Key": "x"} }), "label key"},
			{"bad fingerprint", mod(func(i *EnrollInput) { i.BMC.FingerprintSHA256 = "abc" }), "SHA-256 fingerprint"},
		}
		for _, c := range cases {
			_, err := f.svc.Enroll(ctx, f.admin, c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
			}
			if err != nil && strings.Contains(err.Error(), secretPassword) {
				t.Errorf("%s: error leaks the password", c.name)
			}
		}
		verbCases := []struct {
			verb provision.Verb
			in   VerbInput
			want string
		}{
			{provision.VerbDeploy, VerbInput{Node: "taken"}, "image: is required"},
			{provision.VerbUndeploy, VerbInput{Node: "taken", Wipe: "shred"}, "accepted are quick, full, secure"},
			{provision.VerbPower, VerbInput{Node: "taken", PowerAction: "explode"}, "accepted are on, off, soft, cycle, reset"},
			{provision.VerbManage, VerbInput{Node: "ghost"}, "not found"},
			{provision.VerbManage, VerbInput{}, "node: is required"},
			{provision.VerbManage, VerbInput{Node: "taken"}, "manage refused: node is enrolling"},
		}
		for _, c := range verbCases {
			_, _, err := f.svc.Apply(ctx, f.admin, c.verb, c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %+v: %v, want %q", c.verb, c.in, err, c.want)
			}
		}
		after, _ := st.Dump(ctx)
		if before != after {
			t.Fatalf("refused input changed the store:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

func TestSecretsNeverLeak(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		n, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1"))
		if err != nil {
			t.Fatal(err)
		}
		f.svc.Apply(ctx, f.admin, provision.VerbAbort, VerbInput{Node: n.ID})
		dump, err := st.Dump(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := f.svc.Get(ctx, f.admin, n.ID)
		evs, _ := f.svc.Events(ctx, f.admin, "", 0, 0)
		for what, text := range map[string]string{"database": dump, "logs": f.logs.String(), "node": fmt.Sprintf("%+v", got), "events": fmt.Sprintf("%+v", evs)} {
			if strings.Contains(text, secretPassword) {
				t.Errorf("the BMC password appears in the %s", what)
			}
		}
	})
}

func TestListFiltersAndPages(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		for i := range 25 {
			in := enrollInput(fmt.Sprintf("n%02d", i))
			in.Labels = map[string]string{"rack": fmt.Sprintf("r%d", i%3)}
			if _, err := f.svc.Enroll(ctx, f.admin, in); err != nil {
				t.Fatal(err)
			}
		}
		f.svc.Apply(ctx, f.admin, provision.VerbAbort, VerbInput{Node: "n03"})
		var all []string
		tok := ""
		for pages := 0; ; pages++ {
			nodes, next, err := f.svc.List(ctx, f.admin, ListInput{PageSize: 10, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes {
				all = append(all, n.Name)
			}
			if next == "" {
				if pages != 2 {
					t.Fatalf("%d pages, want 3", pages+1)
				}
				break
			}
			tok = next
		}
		if len(all) != 25 || all[0] != "n00" || all[24] != "n24" {
			t.Fatalf("paged listing: %v", all)
		}
		count := func(in ListInput) int {
			nodes, _, err := f.svc.List(ctx, f.admin, in)
			if err != nil {
				t.Fatalf("%+v: %v", in, err)
			}
			return len(nodes)
		}
		for _, c := range []struct {
			in   ListInput
			want int
		}{
			{ListInput{State: "failed"}, 1},
			{ListInput{State: "enrolling"}, 24},
			{ListInput{Maintenance: "true"}, 1},
			{ListInput{Labels: []string{"rack=r1"}}, 8},
			{ListInput{Labels: []string{"rack=r1"}, State: "enrolling"}, 8},
			{ListInput{Pool: "default", Site: "default"}, 25},
		} {
			if got := count(c.in); got != c.want {
				t.Errorf("%+v: %d nodes, want %d", c.in, got, c.want)
			}
		}
		for _, bad := range []ListInput{{State: "bogus"}, {Maintenance: "yes"}, {PageSize: -1}, {PageSize: 10001}, {PageToken: "xyz"}, {Labels: []string{"novalue"}}} {
			if _, _, err := f.svc.List(ctx, f.admin, bad); err == nil {
				t.Errorf("%+v accepted", bad)
			}
		}
	})
}

func TestRolesAndTenants(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		home, err := f.svc.Enroll(ctx, f.admin, enrollInput("shared-name"))
		if err != nil {
			t.Fatal(err)
		}
		tn, err := f.svc.CreateTenant(ctx, f.admin, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.CreateSite(ctx, f.admin, "acme-nyc", "acme", map[string]string{"dc": "nyc"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.CreatePool(ctx, f.admin, "acme-gpu", "acme-nyc", store.PoolPolicy{HardwareProfile: "ipmi", Labels: map[string]string{"class": "gpu"}}); err != nil {
			t.Fatal(err)
		}
		opSecret, _, err := f.svc.CreateToken(ctx, f.admin, "acme-op", auth.Operator, "acme")
		if err != nil {
			t.Fatal(err)
		}
		op, _ := f.svc.Authenticate(ctx, opSecret)
		viewerSecret, _, _ := f.svc.CreateToken(ctx, f.admin, "acme-view", auth.Viewer, "acme")
		viewer, _ := f.svc.Authenticate(ctx, viewerSecret)
		in := EnrollInput{Name: "shared-name", Pool: "acme-gpu", BMC: BMCInput{Address: "10.1.0.5:623", Username: "admin", Password: secretPassword}}
		n, err := f.svc.Enroll(ctx, op, in)
		if err != nil {
			t.Fatal(err)
		}
		if n.TenantID != tn.ID || n.BMCDriver != "ipmi" || n.Labels["dc"] != "nyc" || n.Labels["class"] != "gpu" {
			t.Fatalf("acme node: %+v", n)
		}
		// The tenant's operator sees its own node by name, not the default tenant's.
		got, err := f.svc.Get(ctx, op, "shared-name")
		if err != nil || got.ID != n.ID {
			t.Fatalf("get by tenant operator: %v", err)
		}
		nodes, _, _ := f.svc.List(ctx, op, ListInput{})
		if len(nodes) != 1 {
			t.Fatalf("tenant operator lists %d nodes", len(nodes))
		}
		// The installation admin must disambiguate a name present in two tenants.
		if _, err := f.svc.Get(ctx, f.admin, "shared-name"); !errors.Is(err, store.ErrAmbiguous) {
			t.Fatalf("ambiguous name: %v", err)
		}
		// The default tenant's pool is invisible to acme.
		if _, err := f.svc.Enroll(ctx, op, enrollInput("x")); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("enroll into another tenant's pool: %v", err)
		}
		var fe *ForbiddenError
		if _, _, err := f.svc.Apply(ctx, viewer, provision.VerbAbort, VerbInput{Node: n.ID}); !errors.As(err, &fe) {
			t.Fatalf("viewer verb: %v", err)
		}
		// Attested results: the default tenant's node has a signed wipe; the admin sees it, a
		// viewer of acme sees its own node's (none) and not the other's, even by raw id.
		if err := st.Write(ctx, func(tx *store.Tx) error {
			c := store.Command{NodeID: home.ID, TenantID: home.TenantID, SiteID: home.SiteID, Kind: "disk.wipe", Args: "{}", RunsOn: "ramdisk", Attested: true}
			if err := tx.InsertCommand(ctx, &c); err != nil {
				return err
			}
			c.State, c.Result = "succeeded", `{"disks":[]}`
			return tx.UpdateCommand(ctx, &c)
		}); err != nil {
			t.Fatal(err)
		}
		if got, err := f.svc.Attestations(ctx, f.admin, home.ID, "disk.wipe", 0); err != nil || len(got) != 1 {
			t.Fatalf("admin: %d attestations, %v", len(got), err)
		}
		if got, err := f.svc.Attestations(ctx, viewer, n.ID, "", 0); err != nil || len(got) != 0 {
			t.Fatalf("acme viewer, own node: %d attestations, %v", len(got), err)
		}
		if got, err := f.svc.Attestations(ctx, viewer, home.ID, "", 0); !errors.Is(err, store.ErrNotFound) && (err != nil || len(got) != 0) {
			t.Fatalf("acme viewer, the other tenant's node by id: %d attestations, %v", len(got), err)
		}
		for _, c := range []struct {
			kind  string
			limit int
		}{{"bmc.power", 0}, {"", 1001}, {"", -1}} {
			if _, err := f.svc.Attestations(ctx, f.admin, home.ID, c.kind, c.limit); err == nil {
				t.Errorf("attestations of kind %q, limit %d accepted", c.kind, c.limit)
			}
		}
		if _, err := f.svc.CreateTenant(ctx, op, "evil"); !errors.As(err, &fe) {
			t.Fatalf("operator creates tenant: %v", err)
		}
		if _, err := f.svc.RevokeToken(ctx, f.admin, "acme-view"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.Authenticate(ctx, viewerSecret); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("revoked token authenticates: %v", err)
		}
	})
}

func TestDeployNeedsASignedCatalogImage(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1")); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"inspecting", "commissioning", "ready"} {
			if n := complete(t, f, "n1"); n.State != want {
				t.Fatalf("chain: %s", n.State)
			}
		}
		pub, key, _ := ed25519.GenerateKey(nil)
		if err := f.svc.AddSigner(ctx, f.admin, "acme", pub); err != nil {
			t.Fatal(err)
		}
		base := catalog.Image{URL: "http://images.test/i", Size: 10, Format: "raw", Compression: "zstd", SHA256: strings.Repeat("b", 64), Signer: "acme"}
		add := func(name string, mutate func(*catalog.Image)) {
			img := base
			img.Name = name
			img.Signature = catalog.Sign(img, key)
			mutate(&img)
			if err := f.svc.AddImage(ctx, f.admin, img); err != nil {
				t.Fatal(err)
			}
		}
		add("unsigned", func(i *catalog.Image) { i.Signature, i.Signer = nil, "" })
		add("tampered", func(i *catalog.Image) { i.URL = "http://evil.test/i" })
		add("good", func(*catalog.Image) {})
		for name, want := range map[string]string{"unsigned": "not signed", "tampered": "does not verify", "nope": "no catalog image"} {
			_, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: name})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("deploy of %s: %v, want %q", name, err, want)
			}
		}
		if err := f.svc.RevokeSigner(ctx, f.admin, "acme"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: "good"}); err == nil || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("deploy of a revoked signer's image: %v", err)
		}
		if n, _ := st.Node(ctx, "n1", ""); n.State != "ready" {
			t.Errorf("refused deploys moved the node to %s", n.State)
		}
	})
}

// TestServersBootstrapOnce: servers starting at once on one empty PostgreSQL store create one
// default tenant and mint one admin token between them.
func TestServersBootstrapOnce(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.DSN(t, store.Postgres)
	sealer, err := secrets.NewSealer(bytes.Repeat([]byte{1}, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	svcs := make([]*Service, n)
	for i := range n {
		st, err := store.Open(ctx, dsn) // migrations are serialized by their own lock
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		svcs[i] = New(st, sealer, slog.New(slog.DiscardHandler))
	}
	tokens := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			tokens[i], errs[i] = svcs[i].Bootstrap(ctx)
		})
	}
	close(start)
	wg.Wait()
	minted := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("server %d: %v", i, errs[i])
		}
		if tokens[i] != "" {
			minted++
		}
	}
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tenants, err := st.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := st.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if minted != 1 || len(toks) != 1 || len(tenants) != 1 {
		t.Fatalf("%d servers showed an admin token, %d tokens and %d tenants stored; want 1 each", minted, len(toks), len(tenants))
	}
}
