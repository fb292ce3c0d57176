package store_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

func seed(t *testing.T, st *store.Store) (store.Pool, []store.Node) {
	t.Helper()
	ctx := context.Background()
	var pool store.Pool
	var nodes []store.Node
	err := st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.PutHardwareProfile(ctx, store.HardwareProfile{Name: "redfish", Drivers: map[string]string{"power": "redfish"}, LocalBoot: "exit"}); err != nil {
			return err
		}
		tn, err := tx.InsertTenant(ctx, "t")
		if err != nil {
			return err
		}
		site, err := tx.InsertSite(ctx, tn.ID, "s", map[string]string{"dc": "nyc"})
		if err != nil {
			return err
		}
		pool, err = tx.InsertPool(ctx, store.Pool{TenantID: tn.ID, SiteID: site.ID, Name: "p", Policy: store.PoolPolicy{HardwareProfile: "redfish"}})
		if err != nil {
			return err
		}
		for i := range 3 {
			n := store.Node{ID: store.NewID(time.Now()), TenantID: tn.ID, SiteID: site.ID, PoolID: pool.ID, Name: fmt.Sprintf("n%d", i),
				State: "enrolling", TargetState: "ready", HardwareProfile: "redfish", BMCDriver: "redfish", BMCAddress: "https://x",
				BMCUsernameRef: "secret://u", BMCPasswordRef: "secret://p", MACs: []string{fmt.Sprintf("52:54:00:00:00:%02x", i)},
				Labels: map[string]string{"rack": "r1"}}
			if err := tx.InsertNode(ctx, &n); err != nil {
				return err
			}
			nodes = append(nodes, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pool, nodes
}

func TestStore(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)

		t.Run("wake-ups coalesce keeping the earliest due time", func(t *testing.T) {
			for _, due := range []time.Duration{time.Minute, 0, time.Hour} {
				if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Wake(ctx, nodes[0].ID, "r", due) }); err != nil {
					t.Fatal(err)
				}
			}
			w, err := st.WakeUps(ctx, 10)
			if err != nil || len(w) != 1 || w[0].DueAt > w[0].EnqueuedAt {
				t.Fatalf("wake-ups: %+v %v", w, err)
			}
		})

		t.Run("stale update refused", func(t *testing.T) {
			n := nodes[1]
			if err := st.Write(ctx, func(tx *store.Tx) error { m := n; m.State = "failed"; return tx.UpdateNode(ctx, &m) }); err != nil {
				t.Fatal(err)
			}
			err := st.Write(ctx, func(tx *store.Tx) error { m := n; m.State = "ready"; return tx.UpdateNode(ctx, &m) })
			if !errors.Is(err, store.ErrStale) {
				t.Fatalf("update at an old version: %v", err)
			}
			got, _ := st.Node(ctx, n.ID, "")
			if got.State != "failed" || got.Version != n.Version+1 {
				t.Fatalf("node after stale update: %s v%d", got.State, got.Version)
			}
		})

		t.Run("a failed write inside a group leaves the others", func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make([]error, 40)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = st.Write(ctx, func(tx *store.Tx) error {
						if err := tx.AppendEvent(ctx, store.Event{Actor: "t", Kind: fmt.Sprintf("k%d", i)}); err != nil {
							return err
						}
						if i%2 == 1 {
							return errors.New("refused")
						}
						return nil
					})
				}()
			}
			wg.Wait()
			evs, err := st.Events(ctx, store.EventFilter{Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]bool{}
			for _, e := range evs {
				kinds[e.Kind] = true
			}
			for i, err := range errs {
				if (i%2 == 1) != (err != nil) || kinds[fmt.Sprintf("k%d", i)] == (i%2 == 1) {
					t.Errorf("write %d: err %v, event stored %v", i, err, kinds[fmt.Sprintf("k%d", i)])
				}
			}
		})

		t.Run("unique MACs across nodes", func(t *testing.T) {
			err := st.Write(ctx, func(tx *store.Tx) error {
				n := nodes[0]
				n.ID, n.Name = store.NewID(time.Now()), "other"
				return tx.InsertNode(ctx, &n)
			})
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("second node with the same MAC: %v", err)
			}
		})

		t.Run("label filter and counts", func(t *testing.T) {
			got, err := st.Nodes(ctx, store.NodeFilter{Labels: [][2]string{{"rack", "r1"}}, Limit: 10})
			if err != nil || len(got) != 3 {
				t.Fatalf("label filter: %d %v", len(got), err)
			}
			counts, err := st.CountByState(ctx)
			if err != nil || counts["enrolling"] != 2 || counts["failed"] != 1 {
				t.Fatalf("counts %v %v", counts, err)
			}
			all := 0
			for _, n := range counts {
				all += n
			}
			nodes, err := st.Nodes(ctx, store.NodeFilter{Limit: 100})
			if err != nil || len(nodes) != all {
				t.Fatalf("nodes %d %v, counted %d", len(nodes), err, all)
			}
			if err := st.Write(ctx, func(tx *store.Tx) error {
				n, err := tx.LockNode(ctx, nodes[0].ID, "")
				if err != nil {
					return err
				}
				n.Maintenance = true
				return tx.UpdateNode(ctx, &n)
			}); err != nil {
				t.Fatal(err)
			}
			if nodes, err = st.Nodes(ctx, store.NodeFilter{Limit: 100}); err != nil {
				t.Fatal(err)
			}
			tenants := map[string]map[string]int{}
			inMaintenance := map[string]int{}
			for _, n := range nodes {
				if tenants[n.TenantID] == nil {
					tenants[n.TenantID] = map[string]int{}
				}
				tenants[n.TenantID][n.State]++
				if n.Maintenance {
					inMaintenance[n.TenantID]++
					inMaintenance[""]++
				}
			}
			if inMaintenance[""] == 0 || inMaintenance[""] == len(nodes) {
				t.Fatalf("the seed has %d of %d nodes in maintenance: the count below would not tell", inMaintenance[""], len(nodes))
			}
			for _, tenant := range append(slices.Collect(maps.Keys(tenants)), "", "no-such-tenant") {
				if got, err := st.CountInMaintenance(ctx, tenant); err != nil || got != inMaintenance[tenant] {
					t.Errorf("tenant %q: %d in maintenance (%v), want %d", tenant, got, err, inMaintenance[tenant])
				}
			}
			tenants["no-such-tenant"] = map[string]int{}
			for tenant, want := range tenants {
				got, err := st.CountByStateOfTenant(ctx, tenant)
				if err != nil || !maps.Equal(got, want) {
					t.Errorf("tenant %q counts %v %v, want %v", tenant, got, err, want)
				}
			}
		})
	})
}

func TestReopenKeepsData(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			dsn := storetest.DSN(t, e)
			st, err := store.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			_, nodes := seed(t, st)
			st.Close()
			st, err = store.Open(context.Background(), dsn) // migrations already applied
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if _, err := st.Node(context.Background(), nodes[2].ID, ""); err != nil {
				t.Fatalf("node after reopen: %v", err)
			}
		})
	}
}

func TestParseDSN(t *testing.T) {
	for _, c := range []struct {
		dsn    string
		engine store.Engine
		ok     bool
	}{
		{"sqlite:/var/lib/bcd/bcd.db", store.SQLite, true},
		{"data/bcd.db", store.SQLite, true},
		{"postgres://u:p@h/db", store.Postgres, true},
		{"postgresql://h/db", store.Postgres, true},
		{"sqlite:", "", false},
		{"mysql://x", "", false},
	} {
		e, _, err := store.ParseDSN(c.dsn)
		if (err == nil) != c.ok || e != c.engine {
			t.Errorf("%q: %s %v", c.dsn, e, err)
		}
	}
	_, _, err := store.ParseDSN("redis://user:hunter2@h")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("DSN error must not show the password: %v", err)
	}
}
