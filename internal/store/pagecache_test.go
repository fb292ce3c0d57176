package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
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

// A page split's swap of its siblings' numbers leaves no mark on the writer's page cache: the
// cache's largest page number stays within the database (a cache whose bound lies past it is
// searched slot by slot at the commit), and the database stays whole.
func TestPageSplitsLeaveTheCacheBoundInTheDatabase(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	swap := splitSwapPage(sqlitePendingByte, 4096)
	for round := range 4 {
		var bound, pages uint32
		if err := s.Write(ctx, func(tx *Tx) error {
			// Commands of nodes in no order: their index by node splits pages in its middle.
			for i := range 1500 {
				c := Command{NodeID: NewID(time.Now()), TenantID: "t", SiteID: "s", Kind: "bmc.power", Subject: "n", RunsOn: "site",
					Args: fmt.Sprintf(`{"round":%d,"i":%d}`, round, i)}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
			}
			bound, pages = pageCacheBound(tx.lc.db)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if pages < 100 || pages >= swap {
			t.Fatalf("round %d: the database holds %d pages; the test needs more than 100 and fewer than %d", round, pages, swap)
		}
		if bound > pages {
			t.Errorf("round %d: the writer's page cache is bounded at page %d in a database of %d pages (the split swap's page is %d)", round, bound, pages, swap)
		}
	}
	var ok string
	if err := s.read.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check %q, %v", ok, err)
	}
	var n int
	if err := s.read.QueryRow(`SELECT COUNT(*) FROM commands`).Scan(&n); err != nil || n != 6000 {
		t.Fatalf("%d commands stored (%v), want 6000", n, err)
	}
}

// pageCacheBound reads, on connection db (an sqlite3*, inside a write transaction), its main
// database's page cache bound (pcache1's iMaxKey) and the database's size in pages.
func pageCacheBound(db uintptr) (bound, pages uint32) {
	main := (*sqlite3.TDb)(at((*sqlite3.Tsqlite3)(at(db)).FaDb))
	shared := (*sqlite3.TBtShared)(at((*sqlite3.TBtree)(at(main.FpBt)).FpBt))
	pager := (*sqlite3.TPager)(at(shared.FpPager))
	cache := (*sqlite3.TPCache)(at(pager.FpPCache))
	return (*sqlite3.TPCache1)(at(cache.FpCache)).FiMaxKey, pager.FdbSize
}

// BenchmarkCommitWithAFullCache writes 32 commands of nodes in no order at a time into a store
// larger than the writer's page cache, as a fleet's writes are: writer-ns/write is the writer
// thread's CPU per write (Store.WriterStats), its commit included.
func BenchmarkCommitWithAFullCache(b *testing.B) {
	ctx := context.Background()
	s := openTempSQLite(b)
	insert := func(n int) func(tx *Tx) error {
		return func(tx *Tx) error {
			for range n {
				c := Command{NodeID: NewID(time.Now()), TenantID: "t", SiteID: "s", Kind: "bmc.power", Subject: "n", RunsOn: "site",
					Args: `{"op":"on","reason":"a step of a workflow, with the arguments a BMC command carries"}`}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for range 40 { // about 30 MiB: past the writer's 16 MiB cache
		if err := s.Write(ctx, insert(1000)); err != nil {
			b.Fatal(err)
		}
	}
	s.MeasureWriterCPU(true) // the writer's CPU is counted only when asked
	cpu := s.WriterStats().CPU
	for b.Loop() {
		if err := s.Write(ctx, insert(32)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.WriterStats().CPU-cpu)/float64(b.N), "writer-ns/write")
}
