package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestAgentCATrustMigration: migration 00036 moves what agents said of their CAs from
// agent_ca_trust into their agents rows (a report whose agent has no row is dropped), so a
// rotation in progress across the upgrade still sees who trusts what; its Down moves it back.
func TestAgentCATrustMigration(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			dsn, db, p := migrationProvider(t, e)
			exec := func(q string) {
				t.Helper()
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if _, err := p.UpTo(ctx, 35); err != nil {
				t.Fatal(err)
			}
			exec(`INSERT INTO agents (id, kind, site_id, connected, cert_not_after) VALUES ('sa1', 'site', 's', TRUE, 77), ('sa-silent', 'site', 's', TRUE, 0)`)
			exec(`INSERT INTO agent_ca_trust (agent_id, trusted, cert_issuer, cert_not_after, reported_at) VALUES ('sa1', 'aa,bb', 'bb', 77, 5), ('sa-unknown', 'aa', 'aa', 1, 6)`)
			if _, err := p.UpTo(ctx, 36); err != nil {
				t.Fatal(err)
			}
			rows := func(q string) []string {
				t.Helper()
				r, err := db.QueryContext(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				var out []string
				for r.Next() {
					var id, trusted, issuer string
					var at int64
					if err := r.Scan(&id, &trusted, &issuer, &at); err != nil {
						t.Fatal(err)
					}
					out = append(out, fmt.Sprintf("%s|%s|%s|%d", id, trusted, issuer, at))
				}
				return out
			}
			if got := rows(`SELECT id, trusted_cas, issuer_ca, ca_reported_at FROM agents ORDER BY id`); !slices.Equal(got, []string{"sa-silent|||0", "sa1|aa,bb|bb|5"}) {
				t.Errorf("after 00036 the agents hold %q", got)
			}
			if _, err := db.ExecContext(ctx, `SELECT 1 FROM agent_ca_trust`); err == nil {
				t.Error("agent_ca_trust is still there after 00036")
			}
			if _, err := p.DownTo(ctx, 35); err != nil {
				t.Fatal(err)
			}
			if got := rows(`SELECT agent_id, trusted, cert_issuer, reported_at FROM agent_ca_trust ORDER BY agent_id`); !slices.Equal(got, []string{"sa1|aa,bb|bb|5"}) {
				t.Errorf("after 00036's Down agent_ca_trust holds %q", got)
			}
			db.Close()

			// The store migrates on: the rotation reads the report from the agent's row.
			st, err := store.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			got, err := st.ConnectedAgentsCATrust(ctx)
			if err != nil || len(got) != 2 {
				t.Fatalf("listed %+v, %v", got, err)
			}
			if s := got[1]; s.AgentID != "sa1" || !s.Reported || !slices.Equal(s.Trusted, []string{"aa", "bb"}) || s.CertIssuer != "bb" || s.CertNotAfter != 77 {
				t.Errorf("sa1 = %+v; want its report carried over", s)
			}
			if s := got[0]; s.AgentID != "sa-silent" || s.Reported {
				t.Errorf("sa-silent = %+v; want unreported", s)
			}
		})
	}
}

// migrationProvider makes a fresh store database of engine e with no migration applied: its
// DSN, a connection to it (closed when the test ends) and a goose provider of the embedded
// migrations over that.
func migrationProvider(t *testing.T, e store.Engine) (string, *sql.DB, *goose.Provider) {
	t.Helper()
	dsn := storetest.DSN(t, e)
	driver, source, dialect := "pgx", dsn, goose.DialectPostgres
	if e == store.SQLite {
		driver, source, dialect = "sqlite", "file:"+strings.TrimPrefix(dsn, "sqlite:"), goose.DialectSQLite3
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(dialect, db, os.DirFS("migrations/"+string(e)))
	if err != nil {
		t.Fatal(err)
	}
	return dsn, db, p
}
