package store_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// An outage of the control plane is the time between two heartbeats of any server longer than
// the gap; it moves the deadlines of the steps in progress (and of their unfinished commands)
// by its length, and leaves finished workflows and finished commands alone. A step whose
// command an agent took keeps the command's deadline (its whole time from when it was taken),
// moved by the outage.
func TestOutageExtendsStepDeadlines(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		var mu = make(chan struct{}, 1)
		now := time.Now()
		st.SetClock(func() time.Time { mu <- struct{}{}; defer func() { <-mu }(); return now })
		advance := func(d time.Duration) { mu <- struct{}{}; now = now.Add(d); <-mu }
		alive := func() time.Duration {
			t.Helper()
			var out time.Duration
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				out, err = tx.ControlPlaneAlive(ctx, 30*time.Second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return out
		}
		if got := alive(); got != 0 {
			t.Fatalf("the first heartbeat ever reports an outage of %s", got)
		}
		advance(20 * time.Second)
		if got := alive(); got != 0 {
			t.Fatalf("20 s between heartbeats (gap 30 s) reported as an outage of %s", got)
		}
		advance(-time.Minute) // the clock went back
		if got := alive(); got != 0 {
			t.Fatalf("a clock that went back reported an outage of %s", got)
		}

		// Three workflows: one whose command an agent took late in the step, one whose command
		// is queued, and one finished.
		start := now.UnixMicro()
		step := (5 * time.Minute).Microseconds()
		type row struct {
			wf  store.Workflow
			cmd store.Command
		}
		rows := map[string]*row{}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for i, name := range []string{"taken", "queued", "finished"} {
				n := nodes[i]
				c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.power", Args: "{}", RunsOn: "site", Deadline: start + step}
				if name == "taken" {
					// Taken four minutes into the step: the agent has five minutes from then.
					c.Deadline = start + (9 * time.Minute).Microseconds()
				}
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				wf := store.Workflow{ID: store.NewID(now), NodeID: n.ID, TenantID: n.TenantID, Profile: "p", Owner: "metal", NodeState: "inspecting",
					Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps", StepStartedAt: start, StepDeadline: start + step, CurrentCommand: c.ID}
				switch name {
				case "taken":
					c.State, c.TargetAgent, c.DeliveredAt = "delivered", "a", start+(4*time.Minute).Microseconds()
				case "finished":
					c.State = "succeeded"
					wf.State, wf.OutcomeApplied = "succeeded", true
				}
				if err := tx.UpdateCommand(ctx, &c); err != nil {
					return err
				}
				if err := tx.InsertWorkflow(ctx, &wf); err != nil {
					return err
				}
				rows[name] = &row{wf: wf, cmd: c}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}

		// Boot entries' join tokens: one still valid when the outage begins, one already
		// expired, one used; and a site's bootstrap token, whose life the operator chose.
		tokens := map[string]store.JoinToken{
			"valid":   {Hash: []byte("valid"), Kind: "node", NodeID: nodes[0].ID, SiteID: nodes[0].SiteID, CommandID: "c1", ExpiresAt: start + step},
			"expired": {Hash: []byte("expired"), Kind: "node", NodeID: nodes[1].ID, SiteID: nodes[1].SiteID, CommandID: "c2", ExpiresAt: start - 1},
			"site":    {Hash: []byte("site"), Kind: "site", SiteID: nodes[0].SiteID, ExpiresAt: start + step},
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, jt := range tokens {
				if err := tx.InsertJoinToken(ctx, jt); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}

		advance(10 * time.Minute)
		outage := alive()
		if outage < 10*time.Minute || outage > 11*time.Minute {
			t.Fatalf("outage %s, want about 10 minutes", outage)
		}
		var extended int
		if err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			extended, err = tx.ExtendStepDeadlines(ctx, outage)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if extended != 2 {
			t.Fatalf("%d workflows extended, want the 2 open ones", extended)
		}
		d := outage.Microseconds()
		cases := []struct {
			name                        string
			started, deadline, cmdAfter int64
		}{
			{"taken", start + d, start + (9 * time.Minute).Microseconds() + d, start + (9 * time.Minute).Microseconds() + d},
			{"queued", start + d, start + step + d, start + step + d},
			{"finished", start, start + step, start + step},
		}
		for name, want := range map[string]int64{"valid": start + step + d, "expired": start - 1, "site": start + step} {
			var got int64
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				got, err = tx.JoinTokenExpiryForTests(ctx, tokens[name].Hash)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("token %s expires at %d, want %d", name, got-start, want-start)
			}
		}
		for _, c := range cases {
			wfs, err := st.Workflows(ctx, rows[c.name].wf.NodeID, 1)
			if err != nil || len(wfs) != 1 {
				t.Fatalf("%s: %v %v", c.name, wfs, err)
			}
			cmd, err := st.Command(ctx, rows[c.name].cmd.ID)
			if err != nil {
				t.Fatal(err)
			}
			if wfs[0].StepStartedAt != c.started || wfs[0].StepDeadline != c.deadline || cmd.Deadline != c.cmdAfter {
				t.Errorf("%s: step started %d, deadline %d, command deadline %d; want %d, %d, %d",
					c.name, wfs[0].StepStartedAt-start, wfs[0].StepDeadline-start, cmd.Deadline-start, c.started-start, c.deadline-start, c.cmdAfter-start)
			}
		}
	})
}

// Spent join tokens go once they are older than the cut: used or expired before it; a token
// still valid, or used after it, stays.
func TestPurgeJoinTokens(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		now := time.Now()
		st.SetClock(func() time.Time { return now })
		at := now.UnixMicro()
		hour := time.Hour.Microseconds()
		tokens := []struct {
			name         string
			used, expiry int64
			kept         bool
		}{
			{"used long ago", at - 10*hour, at - 9*hour, false},
			{"expired long ago", 0, at - 10*hour, false},
			{"used lately", at - hour, at + hour, true},
			{"valid", 0, at + hour, true},
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for i, tk := range tokens {
				jt := store.JoinToken{Hash: []byte(tk.name), Kind: "node", NodeID: nodes[i%len(nodes)].ID, SiteID: nodes[0].SiteID, CommandID: tk.name, ExpiresAt: tk.expiry}
				if err := tx.InsertJoinToken(ctx, jt); err != nil {
					return err
				}
				if tk.used > 0 {
					if err := tx.SetJoinTokenUsedForTests(ctx, jt.Hash, tk.used); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var purged int
		if err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			purged, err = tx.PurgeJoinTokens(ctx, at-5*hour, 100)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if purged != 2 {
			t.Errorf("%d tokens purged, want 2", purged)
		}
		for _, tk := range tokens {
			err := st.Write(ctx, func(tx *store.Tx) error {
				_, err := tx.JoinTokenExpiryForTests(ctx, []byte(tk.name))
				return err
			})
			if kept := err == nil; kept != tk.kept {
				t.Errorf("%s: kept %v, want %v (%v)", tk.name, kept, tk.kept, err)
			}
		}
	})
}

// TestWallStepWaitsForReanchor: the store's local clock runs on the monotonic clock from the
// wall time it was anchored at, so a step of the wall clock shows as WallStep and reaches the
// store's time only with Reanchor; a clock set by a test reports no step.
func TestWallStepWaitsForReanchor(t *testing.T) {
	st := storetest.Open(t, store.SQLite)
	var offset atomic.Int64
	st.SetWall(func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	at := func() time.Time {
		var us int64
		if err := st.Write(context.Background(), func(tx *store.Tx) error { us = tx.At(); return nil }); err != nil {
			t.Fatal(err)
		}
		return time.UnixMicro(us)
	}
	near := func(a, b time.Time) bool { return a.Sub(b).Abs() < time.Second }
	if s := st.WallStep(); s.Abs() > time.Millisecond {
		t.Fatalf("step %s right after anchoring", s)
	}
	offset.Store(int64(time.Hour))
	if s := st.WallStep(); (s - time.Hour).Abs() > time.Millisecond {
		t.Fatalf("step %s, want an hour", s)
	}
	if got := at(); !near(got, time.Now()) {
		t.Fatalf("the store's time followed the step before Reanchor: %s", got)
	}
	st.Reanchor()
	if got := at(); !near(got, time.Now().Add(time.Hour)) || st.WallStep().Abs() > time.Millisecond {
		t.Fatalf("after Reanchor: %s, step %s", got, st.WallStep())
	}
	offset.Store(0) // back: the same, the other way
	if s := st.WallStep(); (s + time.Hour).Abs() > time.Millisecond {
		t.Fatalf("step %s, want minus an hour", s)
	}
	st.SetClock(func() time.Time { return time.Now().Add(5 * time.Hour) })
	if s := st.WallStep(); s != 0 {
		t.Fatalf("a test's clock reports a step of %s", s)
	}
	st.Reanchor() // no effect on a test's clock
	if got := at(); !near(got, time.Now().Add(5*time.Hour)) {
		t.Fatalf("a test's clock was moved: %s", got)
	}
}
