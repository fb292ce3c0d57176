package store_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Behind: only the same store, with fewer beats since the same fence or an earlier fence, went
// back; another store, an empty id, a later fence and more beats did not.
func TestWatermarkBehind(t *testing.T) {
	seen := store.Watermark{StoreID: "s", Fences: 2, Beats: 100}
	for _, tc := range []struct {
		name string
		now  store.Watermark
		want bool
	}{
		{"same", seen, false},
		{"more beats", store.Watermark{StoreID: "s", Fences: 2, Beats: 101}, false},
		{"fewer beats", store.Watermark{StoreID: "s", Fences: 2, Beats: 99}, true},
		{"earlier fence, more beats", store.Watermark{StoreID: "s", Fences: 1, Beats: 500}, true},
		{"later fence, fewer beats", store.Watermark{StoreID: "s", Fences: 3, Beats: 1}, false},
		{"another store", store.Watermark{StoreID: "t", Fences: 0, Beats: 0}, false},
		{"no id", store.Watermark{Fences: 0, Beats: 0}, false},
	} {
		if got := tc.now.Behind(seen); got != tc.want {
			t.Errorf("%s: %+v behind %+v = %v, want %v", tc.name, tc.now, seen, got, tc.want)
		}
	}
	if (store.Watermark{Beats: 1}).Behind(store.Watermark{Beats: 2}) {
		t.Error("watermarks without a store id compared")
	}
}

// A beat counts; a fence loses every queued command (assigned or not) and every held one, and
// only those, wakes
// their nodes, voids the join tokens still usable and only those, and counts itself, so that a
// watermark taken before it is no longer ahead.
func TestFenceRestore(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		before, err := st.Watermark(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if before.StoreID == "" {
			t.Fatal("the store has no id")
		}
		var mark store.Watermark
		ids := map[string]string{}
		now := time.Now().UnixMicro()
		if err := st.Write(ctx, func(tx *store.Tx) error {
			if mark, err = tx.Beat(ctx); err != nil {
				return err
			}
			for _, name := range []string{"queued", "claimed", "held", "delivered", "running", "succeeded", "other-node"} {
				c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.power", Args: "{}", RunsOn: "site"}
				if name == "other-node" {
					c.NodeID = nodes[1].ID
				}
				if name == "claimed" {
					c.TargetAgent = "a"
				}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				switch name {
				case "held":
					c.State = name
					if err := tx.UpdateCommand(ctx, &c); err != nil {
						return err
					}
				case "delivered", "running", "succeeded":
					c.TargetAgent, c.State = "a", name
					if err := tx.UpdateCommand(ctx, &c); err != nil {
						return err
					}
				}
				ids[name] = c.ID
			}
			for i, jt := range []store.JoinToken{
				{Hash: []byte("unused"), Kind: "site", SiteID: n.SiteID, ExpiresAt: now + 3_600_000_000},
				{Hash: []byte("used"), Kind: "site", SiteID: n.SiteID, ExpiresAt: now + 3_600_000_000},
				{Hash: []byte("boot"), Kind: "node", SiteID: n.SiteID, NodeID: n.ID, CommandID: ids["queued"], ExpiresAt: now + 3_600_000_000},
				{Hash: []byte("expired"), Kind: "site", SiteID: n.SiteID, ExpiresAt: now - 1_000_000},
			} {
				if err := tx.InsertJoinToken(ctx, jt); err != nil {
					return err
				}
				if i == 1 {
					if err := tx.SetJoinTokenUsedForTests(ctx, jt.Hash, now); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if mark.StoreID != before.StoreID || mark.Fences != before.Fences || mark.Beats != before.Beats+1 {
			t.Fatalf("after a beat: %+v, before %+v", mark, before)
		}
		var f store.Fenced
		if err := st.Write(ctx, func(tx *store.Tx) error {
			f, err = tx.FenceRestore(ctx)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if f.Commands != 4 || !slices.Equal(f.Nodes, sortedIDs(n.ID, nodes[1].ID)) || f.Tokens != 2 {
			t.Errorf("fenced %d commands on %v, %d tokens; want 4 on %v, 2", f.Commands, f.Nodes, f.Tokens, sortedIDs(n.ID, nodes[1].ID))
		}
		for name, want := range map[string]string{"queued": "lost", "claimed": "lost", "held": "lost", "other-node": "lost", "delivered": "delivered", "running": "running", "succeeded": "succeeded"} {
			c, err := st.Command(ctx, ids[name])
			if err != nil {
				t.Fatal(err)
			}
			if c.State != want {
				t.Errorf("%s command: %s, want %s", name, c.State, want)
			}
			if want == "lost" && (c.Error != store.RestoreFenceError || c.FinishedAt == 0) {
				t.Errorf("%s command: error %q, finished at %d", name, c.Error, c.FinishedAt)
			}
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, h := range []string{"unused", "boot"} {
				if _, err := tx.UseJoinToken(ctx, []byte(h), map[string]string{"unused": "site", "boot": "node"}[h], []byte("k"), 0); err == nil {
					t.Errorf("token %s still usable after the fence", h)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		wakes, err := st.WakeUps(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		var woken []string
		for _, w := range wakes {
			woken = append(woken, w.NodeID)
		}
		slices.Sort(woken)
		if !slices.Equal(woken, f.Nodes) {
			t.Errorf("woken %v, want %v", woken, f.Nodes)
		}
		if f.Watermark.Fences < max(before.Fences+1, now) || f.Watermark.StoreID != before.StoreID {
			t.Errorf("after the fence: %+v", f.Watermark)
		}
		if f.Watermark.Behind(mark) {
			t.Error("a fenced store is behind a watermark taken before the fence")
		}
		if !before.Behind(f.Watermark) {
			t.Error("the store as it was before the fence is not behind the fenced one")
		}
	})
}

func sortedIDs(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// The first agent to show the store went back is recorded, later ones are not, and the restore
// fence clears it.
func TestRestoreWitness(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		if _, ok, err := st.RestoreWitnessed(ctx); err != nil || ok {
			t.Fatalf("a new store witnessed: %v %v", ok, err)
		}
		mark, err := st.Watermark(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first := store.RestoreWitness{AgentID: "a1", Seen: store.Watermark{StoreID: mark.StoreID, Beats: 9}, At: 42}
		for i, w := range []store.RestoreWitness{first, {AgentID: "a2", Seen: store.Watermark{StoreID: mark.StoreID, Beats: 12}, At: 43}} {
			var recorded bool
			if err := st.Write(ctx, func(tx *store.Tx) error {
				recorded, err = tx.WitnessRestore(ctx, w)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if recorded != (i == 0) {
				t.Fatalf("witness %d recorded: %v", i, recorded)
			}
		}
		if got, ok, err := st.RestoreWitnessed(ctx); err != nil || !ok || got != first {
			t.Fatalf("witnessed %+v %v %v, want %+v", got, ok, err, first)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.FenceRestore(ctx); return err }); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := st.RestoreWitnessed(ctx); err != nil || ok {
			t.Fatalf("after the fence, witnessed: %v %v", ok, err)
		}
	})
}

// A backup taken before an earlier fence, restored and fenced again, is not behind the
// watermark a server or agent kept after that earlier fence: fences are numbered by their time.
func TestFenceAfterAnEarlierFence(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.DSN(t, store.SQLite)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if err := st.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.Beat(ctx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The backup: a consistent copy while the store is open, as the operations guide says.
	conn, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(dsn, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(`VACUUM INTO '` + backup + `'`); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	fence := func(st *store.Store) store.Watermark {
		var f store.Fenced
		if err := st.Write(ctx, func(tx *store.Tx) (err error) { f, err = tx.FenceRestore(ctx); return err }); err != nil {
			t.Fatal(err)
		}
		return f.Watermark
	}
	fence(st) // an earlier restore's fence
	var seen store.Watermark
	for range 5 {
		if err := st.Write(ctx, func(tx *store.Tx) (err error) { seen, err = tx.Beat(ctx); return err }); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()

	restored, err := store.Open(ctx, "sqlite:"+backup)
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Close()
	now, err := restored.Watermark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !now.Behind(seen) {
		t.Fatalf("the restored backup %+v is not behind %+v, seen after the earlier fence", now, seen)
	}
	if after := fence(restored); after.Behind(seen) {
		t.Fatalf("fenced again, the store %+v is still behind %+v, seen after the earlier fence", after, seen)
	}
}
