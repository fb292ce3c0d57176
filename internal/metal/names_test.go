package metal

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Tenants, sites, pools, tokens and nodes are looked up by id or name, so a name shaped like an
// id is refused at creation: a tenant's admin who learned another tenant's pool id must not
// name its own pool (or token, site, node) with it, where the installation admin's lookup by
// that id could then find the wrong object.
func TestNamesShapedLikeIDsRefused(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		home, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.CreateTenant(ctx, f.admin, "acme"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.CreateSite(ctx, f.admin, "acme-nyc", "acme", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.CreatePool(ctx, f.admin, "acme-gpu", "acme-nyc", store.PoolPolicy{HardwareProfile: "ipmi"}); err != nil {
			t.Fatal(err)
		}
		secret, _, err := f.svc.CreateToken(ctx, f.admin, "acme-admin", auth.Admin, "acme")
		if err != nil {
			t.Fatal(err)
		}
		acme, err := f.svc.Authenticate(ctx, secret)
		if err != nil {
			t.Fatal(err)
		}
		tenant, _ := st.Tenant(ctx, "default")
		site, _ := st.Site(ctx, "default")
		pool, _ := st.Pool(ctx, "default")
		fresh := store.NewID(time.Now()) // the shape is refused, not only the ids that exist
		before, _ := st.Dump(ctx)

		cases := []struct {
			what string
			call func(name string) error
			ids  []string
		}{
			{"tenant", func(n string) error { _, err := f.svc.CreateTenant(ctx, f.admin, n); return err }, []string{tenant.ID, fresh}},
			{"site", func(n string) error { _, err := f.svc.CreateSite(ctx, acme, n, "", nil); return err }, []string{site.ID, fresh}},
			{"pool", func(n string) error {
				_, err := f.svc.CreatePool(ctx, acme, n, "acme-nyc", store.PoolPolicy{HardwareProfile: "ipmi"})
				return err
			}, []string{pool.ID, fresh}},
			{"token", func(n string) error { _, _, err := f.svc.CreateToken(ctx, acme, n, auth.Viewer, ""); return err }, []string{f.admin.TokenID, fresh}},
			{"node", func(n string) error {
				in := enrollInput(n)
				in.Pool = "acme-gpu"
				in.BMC.Address = "10.1.0.5:623"
				_, err := f.svc.Enroll(ctx, acme, in)
				return err
			}, []string{home.ID, fresh}},
		}
		for _, c := range cases {
			for _, id := range c.ids {
				err := c.call(id)
				var inv *InvalidError
				if !errors.As(err, &inv) || inv.Field != "name" || !strings.Contains(err.Error(), "shaped like an id") || !strings.Contains(err.Error(), nameRule) {
					t.Errorf("%s named %s: %v; want invalid name, shaped like an id, saying what is accepted", c.what, id, err)
				}
			}
		}
		if after, _ := st.Dump(ctx); before != after {
			t.Fatalf("refused names changed the store:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		// The installation admin's lookups by id find what they named.
		if got, err := st.Pool(ctx, pool.ID); err != nil || got.Name != "default" {
			t.Fatalf("pool by id %s: %+v %v", pool.ID, got, err)
		}
		// Names near the shape, and those the docs and tests use, are still accepted.
		for _, name := range []string{"default", "acme-gpu-2", strings.TrimSuffix(fresh, fresh[len(fresh)-1:]), "x" + fresh[1:], fresh + "-b"} {
			if err := ValidLookupName("name", name); err != nil {
				t.Errorf("name %q refused: %v", name, err)
			}
		}
	})
}
