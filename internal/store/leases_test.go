package store_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// DecideLease over every kind of row: free, held by the caller (running or lapsed), held by
// another (running or lapsed).
func TestDecideLease(t *testing.T) {
	const now = 1000
	cases := []struct {
		name string
		l    store.SiteLease
		want store.LeaseDecision
	}{
		{"never taken", store.SiteLease{}, store.LeaseTake},
		{"released", store.SiteLease{Epoch: 3}, store.LeaseTake},
		{"mine, running", store.SiteLease{Holder: "a", ExpiresAt: now + 1}, store.LeaseRenew},
		{"mine, lapsed", store.SiteLease{Holder: "a", ExpiresAt: now}, store.LeaseRenew},
		{"other, running", store.SiteLease{Holder: "b", ExpiresAt: now + 1}, store.LeaseRefuse},
		{"other, lapsed at now", store.SiteLease{Holder: "b", ExpiresAt: now}, store.LeaseTake},
		{"other, lapsed", store.SiteLease{Holder: "b", ExpiresAt: now - 5}, store.LeaseTake},
	}
	for _, c := range cases {
		if got := store.DecideLease(c.l, "a", now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// handClock sets st's clock to one the test moves by hand: now reads it, advance moves it.
func handClock(st *store.Store) (now func() time.Time, advance func(time.Duration)) {
	var mu sync.Mutex
	at := time.Now()
	now = func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
	st.SetClock(now)
	return now, func(d time.Duration) { mu.Lock(); at = at.Add(d); mu.Unlock() }
}

func TestBootLease(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now, advance := handClock(st)
		acquire := func(agent string) store.SiteLease {
			t.Helper()
			var l store.SiteLease
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				l, _, _, err = tx.AcquireLease(ctx, "s1", agent, 10*time.Second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return l
		}
		at := func() int64 { return now().UnixMicro() }

		if l := acquire("a"); !l.HeldBy("a", at()) || l.Epoch != 1 {
			t.Fatalf("first acquire: %+v", l)
		}
		if l := acquire("b"); l.HeldBy("b", at()) || l.Holder != "a" {
			t.Fatalf("b took a running lease: %+v", l)
		}
		advance(5 * time.Second)
		if l := acquire("a"); !l.HeldBy("a", at()) || l.Epoch != 1 || l.ExpiresAt != at()+10e6 {
			t.Fatalf("renewal: %+v", l)
		}
		advance(11 * time.Second) // a died: its lease lapsed
		if l := acquire("b"); !l.HeldBy("b", at()) || l.Epoch != 2 {
			t.Fatalf("b after the lapse: %+v", l)
		}
		if l := acquire("a"); l.HeldBy("a", at()) {
			t.Fatalf("a came back and took b's lease: %+v", l)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.ReleaseLease(ctx, "s1", "a") }); err != nil {
			t.Fatal(err)
		}
		if l, _ := st.Lease(ctx, "s1"); l.Holder != "b" {
			t.Fatalf("a released b's lease: %+v", l)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.ReleaseLease(ctx, "s1", "b") }); err != nil {
			t.Fatal(err)
		}
		if l := acquire("a"); !l.HeldBy("a", at()) || l.Epoch != 3 {
			t.Fatalf("a after b released: %+v", l)
		}
		if l, _ := st.Lease(ctx, "unknown"); l.Holder != "" || l.Epoch != 0 {
			t.Fatalf("lease of a site never leased: %+v", l)
		}
	})
}

func TestBootEntries(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		put := func(e store.BootEntry) uint64 {
			t.Helper()
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.PutBootEntry(ctx, &e) }); err != nil {
				t.Fatal(err)
			}
			return e.Revision
		}
		list := func(after uint64) []store.BootEntry {
			t.Helper()
			var out []store.BootEntry
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				out, err = tx.BootEntries(ctx, "s1", after)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return out
		}
		r1 := put(store.BootEntry{SiteID: "s1", NodeID: "n1", Kind: store.BootEntryRamdisk, MACs: []string{"52:54:00:00:00:01"}, Generation: 2, CommandID: "c1", AgentID: "a"})
		r2 := put(store.BootEntry{SiteID: "s1", NodeID: "n2", Kind: store.BootEntryInstance, MACs: []string{"52:54:00:00:00:02"}, Local: "sanboot", CommandID: "c2", AgentID: "a"})
		put(store.BootEntry{SiteID: "s2", NodeID: "n9", Kind: store.BootEntryRamdisk, MACs: []string{"52:54:00:00:00:09"}})
		if r1 != 1 || r2 != 2 {
			t.Fatalf("revisions %d %d, want 1 2", r1, r2)
		}
		all := list(0)
		if len(all) != 2 || all[0].NodeID != "n1" || all[0].Generation != 2 || all[0].MACs[0] != "52:54:00:00:00:01" || all[1].Local != "sanboot" {
			t.Fatalf("whole table: %+v", all)
		}
		r3 := put(store.BootEntry{SiteID: "s1", NodeID: "n1", Kind: store.BootEntryRemoved, MACs: []string{"52:54:00:00:00:01"}, CommandID: "c3"})
		if d := list(r2); len(d) != 1 || d[0].Kind != store.BootEntryRemoved || d[0].Revision != r3 {
			t.Fatalf("delta after %d: %+v", r2, d)
		}
		if all := list(0); len(all) != 1 || all[0].NodeID != "n2" {
			t.Fatalf("whole table lists a removed entry: %+v", all)
		}
		if l, _ := st.Lease(ctx, "s1"); l.EntriesRev != r3 || l.Holder != "" {
			t.Fatalf("lease row %+v, want entries revision %d and no holder", l, r3)
		}
		e := store.BootEntry{SiteID: "s1", NodeID: "n3", Kind: "pxe"}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.PutBootEntry(ctx, &e) }); err == nil {
			t.Error("an unknown entry kind was accepted")
		}
		// A pinned ISO's sanboot entry carries its ISO; other kinds carry none.
		iso := &store.BootISO{Name: "rescue.iso", URL: "http://images.example/rescue.iso", SHA256: strings.Repeat("ab", 32)}
		r4 := put(store.BootEntry{SiteID: "s1", NodeID: "n4", Kind: store.BootEntrySanboot, MACs: []string{"52:54:00:00:00:04"}, ISO: iso, CommandID: "c4", AgentID: "a"})
		if d := list(r3); len(d) != 1 || d[0].Revision != r4 || d[0].ISO == nil || *d[0].ISO != *iso {
			t.Fatalf("sanboot entry: %+v", d)
		}
		if all := list(0); len(all) != 2 || all[1].NodeID != "n4" || all[1].ISO == nil || all[0].ISO != nil {
			t.Fatalf("whole table with a sanboot entry: %+v", all)
		}
		for _, bad := range []store.BootEntry{
			{SiteID: "s1", NodeID: "n5", Kind: store.BootEntrySanboot},
			{SiteID: "s1", NodeID: "n5", Kind: store.BootEntrySanboot, ISO: &store.BootISO{Name: "x.iso"}},
			{SiteID: "s1", NodeID: "n5", Kind: store.BootEntryRamdisk, ISO: iso},
		} {
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.PutBootEntry(ctx, &bad) }); err == nil {
				t.Errorf("accepted %+v", bad)
			}
		}
	})
}

// Boot-lease kinds go to the holder while its lease runs, to anyone when nobody holds it;
// other kinds go to any agent of the site.
func TestClaimHolderKinds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		siteID := nodes[0].SiteID
		var boot, query string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, kind := range []string{"boot.prepareRamdisk", "bmc.query"} {
				c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: siteID, Kind: kind, Args: "{}", RunsOn: "site"}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				if kind == "bmc.query" {
					query = c.ID
				} else {
					boot = c.ID
				}
			}
			_, _, _, err := tx.AcquireLease(ctx, siteID, "holder", time.Minute)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		claim := func(agent string) map[string]bool {
			t.Helper()
			got := map[string]bool{}
			if err := st.Write(ctx, func(tx *store.Tx) error {
				cs, err := tx.ClaimCommands(ctx, agent, "site", siteID, "", 0, 10, "boot.prepareRamdisk", "boot.cleanUp")
				for _, c := range cs {
					got[c.ID] = true
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return got
		}
		if got := claim("standby"); !got[query] || got[boot] || len(got) != 1 {
			t.Fatalf("standby claimed %v: want only the query %s", got, query)
		}
		if got := claim("holder"); !got[boot] || len(got) != 1 {
			t.Fatalf("holder claimed %v: want the boot command %s", got, boot)
		}
	})
}

// TestDHCPLeases: what a holder reports replaces, per MAC and per address, what was kept; ended
// and expired leases are not listed, and the purge deletes those that ran out, of any site.
func TestDHCPLeases(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now, advance := handClock(st)
		us := func(d time.Duration) int64 { return now().Add(d).UnixMicro() }
		put := func(site string, ls ...store.DHCPLease) {
			t.Helper()
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.PutDHCPLeases(ctx, site, ls) }); err != nil {
				t.Fatal(err)
			}
		}
		list := func(site string) []store.DHCPLease {
			t.Helper()
			var out []store.DHCPLease
			if err := st.Write(ctx, func(tx *store.Tx) error { var err error; out, err = tx.DHCPLeases(ctx, site); return err }); err != nil {
				t.Fatal(err)
			}
			return out
		}
		l := func(mac, ip string, exp int64) store.DHCPLease {
			return store.DHCPLease{MAC: mac, IP: ip, Expires: exp}
		}
		hour, minute := us(time.Hour), us(time.Minute)
		put("s1", l("m1", "10.0.0.1", hour), l("m2", "10.0.0.2", hour), l("m3", "10.0.0.3", minute))
		put("s2", l("m9", "10.0.0.1", hour))                            // another site, the same address
		put("s1", l("m1", "10.0.0.4", hour), l("m4", "10.0.0.2", hour)) // m1 moved; m4 took m2's address
		want := []store.DHCPLease{l("m4", "10.0.0.2", hour), l("m3", "10.0.0.3", minute), l("m1", "10.0.0.4", hour)}
		if got := list("s1"); !slices.Equal(got, want) {
			t.Fatalf("s1 %+v\nwant %+v", got, want)
		}
		put("s1", l("m3", "10.0.0.3", 0)) // ended
		if got := list("s1"); len(got) != 2 {
			t.Fatalf("after m3 ended: %+v", got)
		}
		put("s1", l("m5", "10.0.0.5", minute))
		advance(2 * time.Minute) // m5's lease ran out
		if got := list("s1"); len(got) != 2 || slices.ContainsFunc(got, func(x store.DHCPLease) bool { return x.MAC == "m5" }) {
			t.Fatalf("an expired lease listed: %+v", got)
		}
		var n int
		if err := st.Write(ctx, func(tx *store.Tx) error { var err error; n, err = tx.PurgeDHCPLeases(ctx, tx.At(), 10); return err }); err != nil || n != 1 {
			t.Fatalf("purged %d (%v), want m5's", n, err)
		}
		advance(2 * time.Hour)
		if err := st.Write(ctx, func(tx *store.Tx) error { var err error; n, err = tx.PurgeDHCPLeases(ctx, tx.At(), 10); return err }); err != nil || n != 3 {
			t.Fatalf("purged %d (%v), want the 3 leases of both sites that ran out", n, err)
		}
	})
}
