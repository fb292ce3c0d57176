package store_test

import (
	"context"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A store refuses a database that a newer bcd migrated (here: a migration it does not know
// recorded as applied), saying so, instead of failing its work later: an older server cannot
// read the workflows of a database past 00049.
func TestStoreRefusesANewerSchema(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			dsn, db, _ := migrationProvider(t, e)
			st, err := store.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			st.Close()
			applied := "TRUE"
			if e == store.SQLite {
				applied = "1"
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, `+applied+`)`); err != nil {
				t.Fatal(err)
			}
			st, err = store.Open(ctx, dsn)
			if err == nil {
				st.Close()
				t.Fatal("a database at schema version 9999 was opened")
			}
			if !strings.Contains(err.Error(), "schema is at version 9999, newer than this bcd knows") {
				t.Fatalf("refused with %q, want it to name the database's version and say it is newer", err)
			}
		})
	}
}
