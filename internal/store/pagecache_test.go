package store

import (
	"context"
	"fmt"
	"testing"
)

// A store's connections keep their pages in caches of their own: SQLite's shared group (one
// mutex for every page fetched in the process) counts the pages of each cache that joins it,
// and a store's caches add none while it writes and reads.
func TestStoreConnectionsHaveTheirOwnPageCaches(t *testing.T) {
	ctx := context.Background()
	separatePageCaches()
	if sqlitePageCaches.FisInit == 0 {
		t.Fatal("pcache1's state reads as not initialised: the linked symbol is not SQLite's live state")
	}
	before := sqlitePageCaches.Fgrp.FnMaxPage
	s := openTempSQLite(t)
	for i := 0; i < 50; i++ {
		if err := s.Write(ctx, func(tx *Tx) error {
			_, err := tx.InsertTenant(ctx, fmt.Sprintf("t%d", i))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	tenants, err := s.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tenants) < 50 {
		t.Fatalf("read %d tenants back, want at least 50", len(tenants))
	}
	if after := sqlitePageCaches.Fgrp.FnMaxPage; after != before {
		t.Errorf("the shared page-cache group grew from %d to %d pages while a store was open: its connections' caches joined it", before, after)
	}
}
