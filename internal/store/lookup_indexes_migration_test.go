package store_test

import (
	"context"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Migration 00037 adds its indexes to a store holding rows, its Down removes them, and it
// applies again after that.
func TestLookupIndexesMigration(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			_, db, p := migrationProvider(t, e)
			indexes := `SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname IN ('nodes_site_uuid', 'bmc_credential_versions_unpurged', 'site_dhcp_leases_ip')`
			if e == store.SQLite {
				indexes = `SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name IN ('nodes_site_uuid', 'bmc_credential_versions_unpurged', 'site_dhcp_leases_ip')`
			}
			count := func() int {
				t.Helper()
				var n int
				if err := db.QueryRowContext(ctx, indexes).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if _, err := p.UpTo(ctx, 36); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO bmc_credential_versions (id, node_id, version, username_ref, password_ref, state, created_at)
				VALUES ('v1', 'n1', 1, 'secret://u', 'secret://p', 'superseded', 1), ('v2', 'n1', 2, 'secret://u', '', 'superseded', 2)`); err != nil {
				t.Fatal(err)
			}
			steps := []struct {
				name string
				run  func() error
				want int
			}{
				{"up", func() error { _, err := p.UpTo(ctx, 37); return err }, 3},
				{"down", func() error { _, err := p.DownTo(ctx, 36); return err }, 0},
				{"up again", func() error { _, err := p.UpTo(ctx, 37); return err }, 3},
			}
			for _, s := range steps {
				if err := s.run(); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if got := count(); got != s.want {
					t.Fatalf("after %s: %d of the indexes, want %d", s.name, got, s.want)
				}
			}
		})
	}
}
