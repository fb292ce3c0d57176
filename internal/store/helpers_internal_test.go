package store

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// openTempSQLite opens a SQLite store in a temporary directory, closed when tb ends.
func openTempSQLite(tb testing.TB) *Store {
	tb.Helper()
	s, err := Open(context.Background(), "sqlite://"+filepath.Join(tb.TempDir(), "bcd.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// seedPool stores in tx the "redfish" hardware profile, tenant "t", its site "s" and pool "p".
func seedPool(ctx context.Context, tx *Tx) (Pool, error) {
	if err := tx.PutHardwareProfile(ctx, HardwareProfile{Name: "redfish", Drivers: map[string]string{"power": "redfish"}, LocalBoot: "exit"}); err != nil {
		return Pool{}, err
	}
	tn, err := tx.InsertTenant(ctx, "t")
	if err != nil {
		return Pool{}, err
	}
	site, err := tx.InsertSite(ctx, tn.ID, "s", nil)
	if err != nil {
		return Pool{}, err
	}
	return tx.InsertPool(ctx, Pool{TenantID: tn.ID, SiteID: site.ID, Name: "p", Policy: PoolPolicy{HardwareProfile: "redfish"}})
}

// redfishNode is a node named name of pool p (seedPool), in state, with a Redfish BMC.
func redfishNode(p Pool, name, state string) Node {
	return Node{ID: NewID(time.Now()), TenantID: p.TenantID, SiteID: p.SiteID, PoolID: p.ID, Name: name, State: state,
		HardwareProfile: "redfish", BMCDriver: "redfish", BMCAddress: "https://x", BMCUsernameRef: "secret://u", BMCPasswordRef: "secret://p"}
}

// openWithNode opens a temporary SQLite store (openTempSQLite) holding a pool (seedPool) and
// one node "n" of it in state enrolling (redfishNode), and returns both.
func openWithNode(tb testing.TB) (*Store, Node) {
	tb.Helper()
	ctx := context.Background()
	s := openTempSQLite(tb)
	var node Node
	if err := s.Write(ctx, func(tx *Tx) error {
		pool, err := seedPool(ctx, tx)
		if err != nil {
			return err
		}
		node = redfishNode(pool, "n", "enrolling")
		return tx.InsertNode(ctx, &node)
	}); err != nil {
		tb.Fatal(err)
	}
	return s, node
}

// cacheStep is a write of a test of the SQLite writer's caches (runCacheSteps): whether it fails,
// and the entries the cache holds after it, by name.
type cacheStep struct {
	name   string
	write  func(tx *Tx) error
	fails  bool
	cached []string
}

// runCacheSteps runs each step's write in a write of its own, then, in another, held: it checks
// every entry the cache holds against the database (failing t for each that differs) and returns
// the ids of those it holds, which must be the step's (ids gives each name's id).
func runCacheSteps(t *testing.T, s *Store, ids map[string]string, steps []cacheStep, held func(tx *Tx, step string) []string) {
	t.Helper()
	ctx := context.Background()
	for _, st := range steps {
		err := s.Write(ctx, st.write)
		if st.fails != (err != nil) {
			t.Fatalf("%s: %v", st.name, err)
		}
		var cached []string
		if err := s.Write(ctx, func(tx *Tx) error {
			tx.rows().apply()
			for _, id := range held(tx, st.name) {
				for name, nid := range ids {
					if nid == id {
						cached = append(cached, name)
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		slices.Sort(cached)
		if !slices.Equal(cached, st.cached) {
			t.Errorf("%s: cached %v, want %v", st.name, cached, st.cached)
		}
	}
}
