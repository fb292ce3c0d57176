package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Candidates read outside the writer are taken only where they are still the agent's to take:
// one another agent took meanwhile, one withdrawn (failed) meanwhile, and one whose boot-lease
// kind went to a holder meanwhile are left out; the agent's own reconnect candidates come back
// without a new attempt.
func TestAssignCandidates(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		siteID := nodes[0].SiteID
		ids := map[string]string{}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, name := range []string{"free", "taken", "withdrawn", "mine", "boot"} {
				kind := "bmc.query"
				if name == "boot" {
					kind = "boot.prepareRamdisk"
				}
				c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: siteID, Kind: kind, Args: "{}", RunsOn: "site"}
				if name == "mine" {
					c.TargetAgent = "a"
				}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				ids[name] = c.ID
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		holder := []string{"boot.prepareRamdisk"}
		cands, err := st.CommandCandidates(ctx, "a", "site", siteID, "", 0, 10, true, nil, 0, holder...)
		if err != nil {
			t.Fatal(err)
		}
		if len(cands) != 5 {
			t.Fatalf("candidates: %d, want 5", len(cands))
		}
		// Meanwhile: agent b takes one, the reconciler withdraws one, b becomes the boot-lease holder.
		if err := st.Write(ctx, func(tx *store.Tx) error {
			c, err := tx.Command(ctx, ids["withdrawn"])
			if err != nil {
				return err
			}
			c.State = "failed"
			if err := tx.UpdateCommand(ctx, &c); err != nil {
				return err
			}
			b, err := tx.Command(ctx, ids["taken"])
			if err != nil {
				return err
			}
			if got, err := tx.AssignCommands(ctx, "b", []store.Command{b}); err != nil || len(got) != 1 {
				t.Errorf("b took %d: %v", len(got), err)
			}
			_, _, _, err = tx.AcquireLease(ctx, siteID, "b", time.Minute)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var got []store.Command
		if err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			got, err = tx.AssignCommands(ctx, "a", append(cands, cands[0]), holder...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		byID := map[string]store.Command{}
		for _, c := range got {
			byID[c.ID] = c
		}
		if len(got) != 2 || byID[ids["free"]].ID == "" || byID[ids["mine"]].ID == "" {
			t.Fatalf("a took %d commands %v, want free and mine", len(got), byID)
		}
		if c := byID[ids["free"]]; c.TargetAgent != "a" || c.Attempts != 1 || c.State != "queued" {
			t.Errorf("free: agent %q attempts %d state %s", c.TargetAgent, c.Attempts, c.State)
		}
		if c := byID[ids["mine"]]; c.Attempts != 0 {
			t.Errorf("mine (already a's): attempts %d, want 0", c.Attempts)
		}
		for _, name := range []string{"free", "mine"} {
			c, err := st.Command(ctx, ids[name])
			if err != nil || c.TargetAgent != "a" {
				t.Errorf("%s stored on %q: %v", name, c.TargetAgent, err)
			}
		}
		if c, _ := st.Command(ctx, ids["taken"]); c.TargetAgent != "b" {
			t.Errorf("taken moved to %q", c.TargetAgent)
		}
		if c, _ := st.Command(ctx, ids["boot"]); c.TargetAgent != "" {
			t.Errorf("boot entry command went to %q while b holds the lease", c.TargetAgent)
		}
	})
}

// A claim on a connection that was offered some of its agent's assigned commands reads back only
// those it was not offered, oldest first, then free ones up to the limit; an assigned command
// acknowledged (no longer queued) is not a candidate.
func TestCandidatesLeaveOutWhatWasOffered(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		at := time.Unix(1_800_000_000, 0)
		st.SetClock(func() time.Time { return at })
		var assigned, free []string
		for i := range 9 {
			at = at.Add(time.Second) // created in this order
			if err := st.Write(ctx, func(tx *store.Tx) error {
				c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "bmc.query", Args: "{}", RunsOn: "site"}
				if i < 6 {
					c.TargetAgent = "a"
				}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				if i < 6 {
					assigned = append(assigned, c.ID)
				} else {
					free = append(free, c.ID)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		// Offered: assigned 0, 2, 3 and 5 on this connection; assigned 4 was acknowledged since.
		offeredIDs := map[string]bool{assigned[0]: true, assigned[2]: true, assigned[3]: true, assigned[5]: true}
		offered := func(id string) bool { return offeredIDs[id] }
		if err := st.Write(ctx, func(tx *store.Tx) error {
			_, err := tx.DeliverCommands(ctx, []string{assigned[4]}, store.Acknowledger{AgentID: "a"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// Without assigned, the agent's assigned commands are not looked for: the unassigned
		// ones alone, as many as the limit.
		cases := []struct {
			limit    int
			assigned bool
			want     []string
		}{
			{1, true, []string{assigned[1]}},
			{2, true, []string{assigned[1], free[0]}},
			{3, true, []string{assigned[1], free[0], free[1]}},
			{10, true, []string{assigned[1], free[0], free[1], free[2]}},
			{1, false, []string{free[0]}},
			{10, false, []string{free[0], free[1], free[2]}},
		}
		for _, tc := range cases {
			cands, err := st.CommandCandidates(ctx, "a", "site", nodes[0].SiteID, "", 0, tc.limit, tc.assigned, offered, len(offeredIDs))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cands {
				got = append(got, c.ID)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("limit %d, assigned %v: candidates %v, want %v", tc.limit, tc.assigned, got, tc.want)
			}
		}
	})
}

// UpdateCommandIf writes only over the row as it was read.
func TestUpdateCommandIf(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		var id string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "bmc.query", Args: "{}", RunsOn: "site", TargetAgent: "a"}
			err := tx.InsertCommand(ctx, &c)
			id = c.ID
			return err
		}); err != nil {
			t.Fatal(err)
		}
		was, err := st.Command(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// Someone else moves it on first.
		if err := st.Write(ctx, func(tx *store.Tx) error {
			_, err := tx.DeliverCommands(ctx, []string{id}, store.Acknowledger{AgentID: "a"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			from store.Command
			want bool
		}{
			{"stale read", was, false},
			{"fresh read", store.Command{}, true},
		} {
			if err := st.Write(ctx, func(tx *store.Tx) error {
				from := tc.from
				if from.ID == "" {
					var err error
					if from, err = tx.Command(ctx, id); err != nil {
						return err
					}
				}
				next := from
				next.State, next.Result = "succeeded", `{"power":"on"}`
				ok, err := tx.UpdateCommandIf(ctx, &next, from)
				if ok != tc.want {
					t.Errorf("%s: wrote %v, want %v", tc.name, ok, tc.want)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		if c, _ := st.Command(ctx, id); c.State != "succeeded" {
			t.Errorf("state %s", c.State)
		}
	})
}

// SetWakeUp replaces an unleased wake-up (or removes it with 0) and leaves a leased one to its
// holder.
func TestSetWakeUp(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		a, b := nodes[0].ID, nodes[1].ID
		write := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := st.Write(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		due := func() map[string]int64 {
			t.Helper()
			ws, err := st.WakeUps(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			m := map[string]int64{}
			for _, w := range ws {
				m[w.NodeID] = w.DueAt
			}
			return m
		}
		write(func(tx *store.Tx) error { return tx.Wake(ctx, a, "test", 0) })
		write(func(tx *store.Tx) error { return tx.Wake(ctx, b, "test", 0) })
		// b is leased by a worker.
		leases, err := st.ClaimWakeUps(ctx, "worker", time.Minute, 100)
		if err != nil || len(leases) != 2 {
			t.Fatalf("leased %d: %v", len(leases), err)
		}
		var lb store.Lease
		for _, l := range leases {
			if l.NodeID == b {
				lb = l
			}
		}
		write(func(tx *store.Tx) error {
			for _, l := range leases {
				if l.NodeID == a {
					return tx.FinishWakeUp(ctx, l, "worker", time.Hour) // released, due in an hour
				}
			}
			return nil
		})
		before := due()
		var at int64
		write(func(tx *store.Tx) error {
			at = tx.At()
			if err := tx.SetWakeUp(ctx, a, "deadline", time.Minute, -1); err != nil {
				return err
			}
			return tx.SetWakeUp(ctx, b, "deadline", time.Minute, -1)
		})
		after := due()
		if after[a] != at+time.Minute.Microseconds() {
			t.Errorf("a due at %d, want %d (was %d)", after[a], at+time.Minute.Microseconds(), before[a])
		}
		if after[b] != before[b] {
			t.Errorf("leased b moved from %d to %d", before[b], after[b])
		}
		write(func(tx *store.Tx) error {
			if err := tx.SetWakeUp(ctx, a, "", 0, -1); err != nil {
				return err
			}
			return tx.SetWakeUp(ctx, b, "", 0, -1)
		})
		after = due()
		if _, ok := after[a]; ok {
			t.Errorf("a still has a wake-up")
		}
		if _, ok := after[b]; !ok {
			t.Errorf("leased b's wake-up was removed")
		}
		write(func(tx *store.Tx) error { return tx.FinishWakeUp(ctx, lb, "worker", 0) })

		// Guarded by the wake sequence read before a reconciliation: a wake-up that came
		// meanwhile stands; none came, the row is set or removed.
		seqOf := func(id string) (seq int64) {
			t.Helper()
			write(func(tx *store.Tx) (err error) { seq, err = tx.WakeUpSeq(ctx, id); return err })
			return seq
		}
		if s := seqOf(a); s != 0 {
			t.Fatalf("a has no wake-up, read seq %d, want 0", s)
		}
		write(func(tx *store.Tx) error { return tx.SetWakeUp(ctx, a, "", 0, 0) }) // nothing to remove
		write(func(tx *store.Tx) error { return tx.Wake(ctx, a, "meanwhile", 0) })
		woken := due()[a]
		write(func(tx *store.Tx) error { return tx.SetWakeUp(ctx, a, "deadline", time.Hour, 0) })
		if got := due()[a]; got != woken {
			t.Errorf("a wake-up that came after a read of no row moved from %d to %d", woken, got)
		}
		s := seqOf(a)
		write(func(tx *store.Tx) error { return tx.Wake(ctx, a, "meanwhile", 0) })
		write(func(tx *store.Tx) error { return tx.SetWakeUp(ctx, a, "", 0, s) })
		if _, ok := due()[a]; !ok {
			t.Errorf("a wake-up that came after the read was removed")
		}
		write(func(tx *store.Tx) error { return tx.SetWakeUp(ctx, a, "deadline", time.Hour, s) })
		if got := due()[a]; got != woken {
			t.Errorf("a wake-up that came after the read moved from %d to %d", woken, got)
		}
		s = seqOf(a)
		write(func(tx *store.Tx) error {
			at = tx.At()
			return tx.SetWakeUp(ctx, a, "deadline", time.Hour, s)
		})
		if got := due()[a]; got != at+time.Hour.Microseconds() {
			t.Errorf("a, not woken since the read, due at %d, want %d", got, at+time.Hour.Microseconds())
		}
		write(func(tx *store.Tx) error { return tx.SetWakeUp(ctx, a, "", 0, s) })
		if _, ok := due()[a]; ok {
			t.Errorf("a, not woken since the read, still has a wake-up")
		}
	})
}

// SetWakeUp keeps a wake-up still ahead that comes no later than the one it sets: the
// reconciler, woken at it, finds nothing due and sets the next (a node that moves from step to
// step writes no wake-up row for each). One that comes later, one already due, and one that
// ends a run of failures are replaced.
func TestSetWakeUpKeepsAnEarlierOneAhead(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		id := nodes[0].ID
		type row struct {
			due      int64
			failures int
		}
		read := func() row {
			t.Helper()
			ws, err := st.WakeUps(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range ws {
				if w.NodeID == id {
					f, _, err := st.ReconcileFailuresOf(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					return row{w.DueAt, f.Count}
				}
			}
			t.Fatalf("node %s has no wake-up", id)
			return row{}
		}
		// set runs SetWakeUp after prepare, in one transaction, and returns its clock.
		set := func(again time.Duration, prepare string) (at int64) {
			t.Helper()
			if err := st.Write(ctx, func(tx *store.Tx) error {
				at = tx.At()
				if prepare != "" {
					if _, err := tx.ExecForTests(ctx, prepare, id); err != nil {
						return err
					}
				}
				return tx.SetWakeUp(ctx, id, "deadline", again, -1)
			}); err != nil {
				t.Fatal(err)
			}
			return at
		}
		at := set(time.Minute, "")
		first := at + time.Minute.Microseconds()
		steps := []struct {
			name    string
			again   time.Duration
			prepare string // run on the row first (id bound)
			want    func(at int64) row
		}{
			{"a later deadline keeps the earlier one", time.Hour, "",
				func(int64) row { return row{first, 0} }},
			{"an earlier deadline replaces it", 10 * time.Second, "",
				func(at int64) row { return row{at + (10 * time.Second).Microseconds(), 0} }},
			{"one already due is replaced", time.Hour, `UPDATE reconcile_queue SET due_at = 1 WHERE node_id = ?`,
				func(at int64) row { return row{at + time.Hour.Microseconds(), 0} }},
			{"one ending a run of failures is replaced", 2 * time.Hour, `UPDATE reconcile_queue SET failures = 3, failing_since = 1, last_error = 'boom' WHERE node_id = ?`,
				func(at int64) row { return row{at + (2 * time.Hour).Microseconds(), 0} }},
		}
		for _, s := range steps {
			at = set(s.again, s.prepare)
			if got, want := read(), s.want(at); got != want {
				t.Errorf("%s: %+v, want %+v", s.name, got, want)
			}
		}
	})
}

// DeliverCommands marks delivered exactly the queued commands assigned to the acknowledging
// agent, across statements (more ids than one IN list holds), and returns them.
func TestDeliverCommands(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		var mine, others []string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			mine, others = nil, nil
			for i := range 300 + 2 {
				c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "bmc.query", RunsOn: "site", TargetAgent: "a"}
				switch i {
				case 300:
					c.TargetAgent = "b" // another agent's
				case 301:
					c.State = "delivered" // acknowledged before
				}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				if i < 300 {
					mine = append(mine, c.ID)
				} else {
					others = append(others, c.ID)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ids := append(append(append([]string{}, mine...), others...), "no-such-command")
		var done map[string]bool
		if err := st.Write(ctx, func(tx *store.Tx) (err error) {
			done, err = tx.DeliverCommands(ctx, ids, store.Acknowledger{AgentID: "a"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(done) != len(mine) {
			t.Errorf("%d commands marked delivered, want %d", len(done), len(mine))
		}
		for _, id := range mine {
			c, err := st.Command(ctx, id)
			if err != nil || !done[id] || c.State != "delivered" || c.DeliveredAt == 0 {
				t.Fatalf("command %s: marked %v, state %s, delivered at %d (%v)", id, done[id], c.State, c.DeliveredAt, err)
			}
		}
		for _, id := range others {
			if done[id] {
				t.Errorf("command %s (not a queued command of a) was marked delivered", id)
			}
		}
		if c, _ := st.Command(ctx, others[0]); c.State != "queued" {
			t.Errorf("another agent's command is %s, want queued", c.State)
		}
	})
}

// One command at a time (most claims and acknowledgements; SQLite runs them without
// RETURNING): assigned only when still queued and free or already the agent's (a free one counts
// an attempt), delivered only when queued, the acknowledging agent's and of its generation.
func TestOneCommandAssignedAndDelivered(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		insert := func(agent, state string, gen uint64) string {
			var id string
			if err := st.Write(ctx, func(tx *store.Tx) error {
				c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "inventory.collect",
					Args: "{}", RunsOn: "ramdisk", TargetAgent: agent, State: state, Generation: gen}
				err := tx.InsertCommand(ctx, &c)
				id = c.ID
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return id
		}
		for _, tc := range []struct {
			name         string
			agent, state string
			taken        bool
			attempts     int
		}{
			{name: "free", agent: "", state: "queued", taken: true, attempts: 1},
			{name: "already the agent's", agent: "a", state: "queued", taken: true, attempts: 0},
			{name: "another agent's", agent: "b", state: "queued"},
			{name: "no longer queued", agent: "", state: "failed"},
		} {
			id := insert(tc.agent, tc.state, 1)
			var got []store.Command
			if err := st.Write(ctx, func(tx *store.Tx) error {
				c, err := tx.Command(ctx, id)
				if err != nil {
					return err
				}
				got, err = tx.AssignCommands(ctx, "a", []store.Command{c})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if taken := len(got) == 1; taken != tc.taken {
				t.Errorf("assign %s: taken %v, want %v", tc.name, taken, tc.taken)
				continue
			}
			if tc.taken && (got[0].Attempts != tc.attempts || got[0].TargetAgent != "a") {
				t.Errorf("assign %s: attempts %d agent %q, want %d and a", tc.name, got[0].Attempts, got[0].TargetAgent, tc.attempts)
			}
			if c, _ := st.Command(ctx, id); tc.taken && c.Attempts != tc.attempts {
				t.Errorf("assign %s: stored attempts %d, want %d", tc.name, c.Attempts, tc.attempts)
			}
		}
		node := store.Acknowledger{AgentID: "a", Node: true, Generation: 1}
		for _, tc := range []struct {
			name         string
			agent, state string
			gen          uint64
			by           store.Acknowledger
			delivered    bool
		}{
			{name: "the agent's, queued", agent: "a", state: "queued", gen: 1, by: node, delivered: true},
			{name: "another agent's", agent: "b", state: "queued", gen: 1, by: node},
			{name: "of another generation", agent: "a", state: "queued", gen: 2, by: node},
			{name: "acknowledged before", agent: "a", state: "delivered", gen: 1, by: node},
			{name: "a site agent's, queued", agent: "a", state: "queued", gen: 7, by: store.Acknowledger{AgentID: "a"}, delivered: true},
		} {
			id := insert(tc.agent, tc.state, tc.gen)
			var done map[string]bool
			if err := st.Write(ctx, func(tx *store.Tx) (err error) {
				done, err = tx.DeliverCommands(ctx, []string{id}, tc.by)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			c, _ := st.Command(ctx, id)
			if done[id] != tc.delivered || (c.State == "delivered" && tc.state != "delivered") != tc.delivered {
				t.Errorf("deliver %s: marked %v, stored %s; want delivered %v", tc.name, done[id], c.State, tc.delivered)
			}
		}
	})
}
