package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// decision is one conditional decision on a discovered machine.
type decision struct {
	reject bool
	seen   string // RecordAcceptance's: the acceptance the caller read
	node   string // RecordAcceptance's
	want   bool   // recorded
}

func (c decision) record(ctx context.Context, tx *store.Tx, siteID, mac string) (store.Discovery, bool, error) {
	if c.reject {
		return tx.RecordRejection(ctx, siteID, mac, "token:r")
	}
	return tx.RecordAcceptance(ctx, siteID, mac, c.node, "token:a", c.seen)
}

// A decision on a discovered machine is recorded only on the machine as its caller read it: a
// rejection is refused once an acceptance enrolled the machine; an acceptance is refused once
// another one enrolled it, or when it was rejected since it was read (not when it was read
// rejected: that acceptance overrides the rejection). A refused decision changes nothing and
// returns the machine as it is.
func TestDecisionsOnTheMachineAsRead(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		siteID := nodes[0].SiteID
		accept := func(seen, node string, want bool) decision { return decision{seen: seen, node: node, want: want} }
		reject := func(want bool) decision { return decision{reject: true, want: want} }
		cases := []struct {
			name     string
			auto     bool // autoAccept recorded the machine's acceptance first (AcceptPending)
			steps    []decision
			want     string // the machine's acceptance at the end
			wantNode string
		}{
			{"accepted undecided", false, []decision{accept("", "node-a", true)}, store.AcceptanceAccepted, "node-a"},
			{"rejected undecided", false, []decision{reject(true)}, store.AcceptanceRejected, ""},
			{"reject once accepted", false, []decision{accept("", "node-a", true), reject(false)}, store.AcceptanceAccepted, "node-a"},
			{"accept once accepted", false, []decision{accept("", "node-a", true), accept("", "node-b", false)}, store.AcceptanceAccepted, "node-a"},
			{"accept once accepted, read rejected", false, []decision{reject(true), accept(store.AcceptanceRejected, "node-a", true),
				accept(store.AcceptanceRejected, "node-b", false)}, store.AcceptanceAccepted, "node-a"},
			{"accept rejected since read", false, []decision{reject(true), accept("", "node-a", false)}, store.AcceptanceRejected, ""},
			{"accept read rejected", false, []decision{reject(true), accept(store.AcceptanceRejected, "node-a", true)}, store.AcceptanceAccepted, "node-a"},
			{"rejected twice", false, []decision{reject(true), reject(true)}, store.AcceptanceRejected, ""},
			{"auto-accepted, enrolled", true, []decision{accept(store.AcceptanceAccepted, "node-a", true)}, store.AcceptanceAccepted, "node-a"},
			{"auto-accepted, read undecided, enrolled", true, []decision{accept("", "node-a", true)}, store.AcceptanceAccepted, "node-a"},
			{"auto-accepted, rejected, enrolled", true, []decision{reject(true), accept(store.AcceptanceAccepted, "node-a", false)}, store.AcceptanceRejected, ""},
		}
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				mac := fmt.Sprintf("52:54:00:de:00:%02x", i)
				now := time.Now().UnixMicro()
				if err := st.Write(ctx, func(tx *store.Tx) error {
					if err := tx.RecordDiscovered(ctx, store.Discovery{SiteID: siteID, MAC: mac, FirstSeen: now, LastSeen: now}); err != nil {
						return err
					}
					if c.auto {
						if ok, err := tx.AcceptPending(ctx, siteID, mac, "autoAccept:p"); err != nil || !ok {
							return fmt.Errorf("auto-accepting: %v %v", ok, err)
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				for j, step := range c.steps {
					var (
						before, got store.Discovery
						ok          bool
					)
					if err := st.Write(ctx, func(tx *store.Tx) (err error) {
						got, ok, err = step.record(ctx, tx, siteID, mac)
						return err
					}); err != nil {
						t.Fatalf("step %d: %v", j, err)
					}
					if ok != step.want {
						t.Fatalf("step %d %+v: recorded %v, want %v", j, step, ok, step.want)
					}
					if !ok {
						if before, _ = st.DiscoveryOf(ctx, siteID, mac); got != before {
							t.Errorf("step %d: a refused decision returned %+v, the machine is %+v", j, got, before)
						}
					}
				}
				d, err := st.DiscoveryOf(ctx, siteID, mac)
				if err != nil || d.Acceptance != c.want || d.NodeID != c.wantNode {
					t.Errorf("machine %+v (%v), want %q as node %q", d, err, c.want, c.wantNode)
				}
			})
		}
		t.Run("never seen", func(t *testing.T) {
			for _, step := range []decision{reject(false), accept("", "node-a", false)} {
				err := st.Write(ctx, func(tx *store.Tx) error {
					_, _, err := step.record(ctx, tx, siteID, "52:54:00:de:ff:ff")
					return err
				})
				if !errors.Is(err, store.ErrNotFound) {
					t.Errorf("%+v on a MAC never seen: %v, want not found", step, err)
				}
			}
		})
	})
}

// An acceptance and a rejection of one machine read undecided, written at once (on PostgreSQL
// in two concurrent transactions): exactly one is recorded, and the machine says which.
func TestAcceptanceAndRejectionAtOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		siteID := nodes[0].SiteID
		for i := range 50 {
			mac := fmt.Sprintf("52:54:00:df:00:%02x", i)
			now := time.Now().UnixMicro()
			if err := st.Write(ctx, func(tx *store.Tx) error {
				return tx.RecordDiscovered(ctx, store.Discovery{SiteID: siteID, MAC: mac, FirstSeen: now, LastSeen: now})
			}); err != nil {
				t.Fatal(err)
			}
			var (
				wg    sync.WaitGroup
				start = make(chan struct{})
				ok    [2]bool
				errs  [2]error
			)
			for j, step := range []decision{{node: "node-a"}, {reject: true}} {
				wg.Go(func() {
					<-start
					errs[j] = st.Write(ctx, func(tx *store.Tx) (err error) {
						_, ok[j], err = step.record(ctx, tx, siteID, mac)
						return err
					})
				})
			}
			close(start)
			wg.Wait()
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("round %d: %v; %v", i, errs[0], errs[1])
			}
			if ok[0] == ok[1] {
				t.Fatalf("round %d: acceptance recorded %v, rejection recorded %v: want exactly one", i, ok[0], ok[1])
			}
			d, err := st.DiscoveryOf(ctx, siteID, mac)
			if err != nil {
				t.Fatal(err)
			}
			if ok[0] && (d.Acceptance != store.AcceptanceAccepted || d.NodeID != "node-a") ||
				ok[1] && (d.Acceptance != store.AcceptanceRejected || d.NodeID != "") {
				t.Fatalf("round %d: acceptance recorded %v, but the machine is %q as node %q", i, ok[0], d.Acceptance, d.NodeID)
			}
		}
	})
}

// TestDeletedNodeReleasesItsMachine: deleting a node an acceptance enrolled makes its machine
// undecided again, so that it can be accepted anew; a machine accepted as another node keeps
// its decision.
func TestDeletedNodeReleasesItsMachine(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		siteID := nodes[0].SiteID
		now := time.Now().UnixMicro()
		macs := []string{"52:54:00:de:01:01", "52:54:00:de:01:02"}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for i, mac := range macs {
				if err := tx.RecordDiscovered(ctx, store.Discovery{SiteID: siteID, MAC: mac, FirstSeen: now, LastSeen: now}); err != nil {
					return err
				}
				if _, ok, err := tx.RecordAcceptance(ctx, siteID, mac, nodes[i].ID, "token:a", ""); err != nil || !ok {
					return fmt.Errorf("accepting %s: %v %v", mac, ok, err)
				}
			}
			n, err := tx.LockNode(ctx, nodes[0].ID, "")
			if err != nil {
				return err
			}
			return tx.DeleteNode(ctx, n)
		}); err != nil {
			t.Fatal(err)
		}
		if d, err := st.DiscoveryOf(ctx, siteID, macs[0]); err != nil || d.Acceptance != store.AcceptancePending || d.NodeID != "" || d.DecidedBy != "" {
			t.Fatalf("the deleted node's machine: %+v, %v; want undecided", d, err)
		}
		if d, err := st.DiscoveryOf(ctx, siteID, macs[1]); err != nil || d.Acceptance != store.AcceptanceAccepted || d.NodeID != nodes[1].ID {
			t.Fatalf("another node's machine: %+v, %v; want accepted as %s", d, err, nodes[1].ID)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			_, ok, err := tx.RecordAcceptance(ctx, siteID, macs[0], "node-again", "token:a", store.AcceptancePending)
			if err == nil && !ok {
				err = errors.New("refused")
			}
			return err
		}); err != nil {
			t.Fatalf("accepting the released machine again: %v", err)
		}
	})
}
