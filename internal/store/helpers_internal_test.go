package store

import (
	"context"
	"path/filepath"
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
