package metal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// discovered records mac as seen PXE-booting at the default site and returns the site's id.
func discovered(t *testing.T, st *store.Store, mac string) string {
	t.Helper()
	ctx := context.Background()
	site, err := st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	if err := st.Write(ctx, func(tx *store.Tx) error {
		return tx.RecordDiscovered(ctx, store.Discovery{SiteID: site.ID, MAC: mac, FirstSeen: now, LastSeen: now})
	}); err != nil {
		t.Fatal(err)
	}
	return site.ID
}

func acceptInput(mac, name string) AcceptInput {
	return AcceptInput{Site: "default", MAC: mac, Pool: "default", Name: name,
		BMC: BMCInput{Address: "https://10.0.0.5", Username: "root", Password: secretPassword}}
}

// macOwner is the node that holds mac, "" when none.
func macOwner(t *testing.T, st *store.Store, mac string) string {
	t.Helper()
	var owner string
	if err := st.Write(context.Background(), func(tx *store.Tx) (err error) {
		owner, err = tx.MACOwner(context.Background(), mac)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return owner
}

// A reject that comes once the acceptance's node is enrolled (here: from the wake-up the
// enrolment sends when it committed) is refused, naming the node; the machine stays accepted
// as that node. Before, the reject was recorded between the enrolment and the acceptance's
// record, and the machine's rejection was then overwritten.
func TestRejectOfAnEnrolledAcceptanceIsRefused(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		const mac = "52:54:00:dc:00:01"
		siteID := discovered(t, st, mac)
		var (
			once      sync.Once
			rejectErr = errors.New("the reject did not run")
		)
		f.svc.OnWake(func() {
			once.Do(func() { rejectErr = f.svc.RejectDiscovered(ctx, f.admin, "default", mac, "not ours") })
		})
		n, err := f.svc.AcceptDiscovered(ctx, f.admin, acceptInput(mac, "accepted-1"))
		if err != nil {
			t.Fatal(err)
		}
		var conf *ConflictError
		if !errors.As(rejectErr, &conf) || !strings.Contains(rejectErr.Error(), "reject "+mac+": it was accepted as node "+n.ID) {
			t.Errorf("reject once the acceptance enrolled node %s: %v; want a conflict naming the node", n.ID, rejectErr)
		}
		d, err := st.DiscoveryOf(ctx, siteID, mac)
		if err != nil || d.Acceptance != store.AcceptanceAccepted || d.NodeID != n.ID || d.DecidedBy != f.admin.Actor() {
			t.Errorf("decision %+v (%v), want accepted as node %s by %s", d, err, n.ID, f.admin.Actor())
		}
		// Rejecting it later is refused the same way.
		if err := f.svc.RejectDiscovered(ctx, f.admin, "default", mac, ""); !errors.As(err, &conf) || !strings.Contains(err.Error(), n.ID) {
			t.Errorf("reject of an accepted machine: %v", err)
		}
	})
}

// An operator may accept a machine rejected earlier: the acceptance overrides the rejection.
func TestAcceptAfterRejectOverrides(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		const mac = "52:54:00:dc:00:02"
		siteID := discovered(t, st, mac)
		if err := f.svc.RejectDiscovered(ctx, f.admin, "default", mac, "not ours"); err != nil {
			t.Fatal(err)
		}
		// The rejection is audited: who, why, which machine.
		evs, err := st.Events(ctx, store.EventFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		audited := slices.ContainsFunc(evs, func(e store.Event) bool {
			return e.Kind == "discovery.rejected" && e.Actor == f.admin.Actor() && e.Reason == "not ours" && strings.Contains(e.Data, mac)
		})
		if !audited {
			t.Errorf("no discovery.rejected event by %s with its reason and MAC among %d events", f.admin.Actor(), len(evs))
		}
		n, err := f.svc.AcceptDiscovered(ctx, f.admin, acceptInput(mac, "accepted-2"))
		if err != nil {
			t.Fatalf("accepting a machine rejected before: %v", err)
		}
		if d, err := st.DiscoveryOf(ctx, siteID, mac); err != nil || d.Acceptance != store.AcceptanceAccepted || d.NodeID != n.ID {
			t.Errorf("decision %+v (%v), want accepted as node %s", d, err, n.ID)
		}
	})
}

// Two accepts and a reject of one machine at once, many times over: whatever the order, the
// outcome is one of the serial ones. Either one accept enrolled a node, which holds the MAC, the
// machine is recorded accepted as that node, and the other accept and the reject (unless it
// came first) were refused; or the reject won, nothing holds the MAC, no node of either accept
// exists, and both accepts were refused saying the machine was rejected. Every other round the
// reject starts when the first enrolment committed (its wake-up) rather than with the accepts:
// before, it then often read the machine undecided and recorded its rejection over the
// acceptance of the node just enrolled.
func TestAcceptAndRejectAtOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		const rounds = 40
		outcomes := map[string]int{}
		var (
			mu     sync.Mutex
			onWake func() // the round's, run by the first wake-up
		)
		f.svc.OnWake(func() {
			mu.Lock()
			w := onWake
			onWake = nil
			mu.Unlock()
			if w != nil {
				w()
			}
		})
		for i := range rounds {
			mac := fmt.Sprintf("52:54:00:dd:00:%02x", i)
			siteID := discovered(t, st, mac)
			var (
				wg        sync.WaitGroup
				start     = make(chan struct{})
				nodes     [2]store.Node
				acceptErr [2]error
				rejectErr error
			)
			for j := range 2 {
				wg.Go(func() {
					<-start
					nodes[j], acceptErr[j] = f.svc.AcceptDiscovered(ctx, f.admin, acceptInput(mac, fmt.Sprintf("race-%d-%d", i, j)))
				})
			}
			reject := func() { rejectErr = f.svc.RejectDiscovered(ctx, f.admin, "default", mac, "not ours") }
			if i%2 == 0 {
				wg.Go(func() {
					<-start
					reject()
				})
			} else {
				// Started by an accept's goroutine, which the group still counts.
				mu.Lock()
				onWake = func() { wg.Go(reject) }
				mu.Unlock()
			}
			close(start)
			wg.Wait()

			d, err := st.DiscoveryOf(ctx, siteID, mac)
			if err != nil {
				t.Fatal(err)
			}
			owner := macOwner(t, st, mac)
			won := -1
			for j := range 2 {
				if acceptErr[j] == nil {
					if won >= 0 {
						t.Fatalf("round %d: both accepts enrolled a node: %s and %s", i, nodes[won].ID, nodes[j].ID)
					}
					won = j
				}
			}
			var conf *ConflictError
			if won >= 0 {
				n := nodes[won]
				if owner != n.ID || d.Acceptance != store.AcceptanceAccepted || d.NodeID != n.ID {
					t.Fatalf("round %d: accept enrolled node %s, but the MAC is held by %q and the machine is %q as node %q (reject: %v)",
						i, n.ID, owner, d.Acceptance, d.NodeID, rejectErr)
				}
				other := acceptErr[1-won]
				if !errors.Is(other, store.ErrConflict) && !errors.As(other, &conf) {
					t.Errorf("round %d: the other accept: %v, want a conflict", i, other)
				}
				if _, err := st.Node(ctx, fmt.Sprintf("race-%d-%d", i, 1-won), ""); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("round %d: the refused accept's node exists (%v)", i, err)
				}
				if rejectErr != nil {
					if !errors.As(rejectErr, &conf) || !strings.Contains(rejectErr.Error(), "accepted as node "+n.ID) {
						t.Errorf("round %d: reject: %v, want a conflict naming node %s", i, rejectErr, n.ID)
					}
					outcomes["accepted, reject refused"]++
				} else {
					outcomes["rejected, then accepted"]++
				}
				continue
			}
			if rejectErr != nil {
				t.Fatalf("round %d: all three refused: accepts %v, %v; reject %v", i, acceptErr[0], acceptErr[1], rejectErr)
			}
			if owner != "" || d.Acceptance != store.AcceptanceRejected || d.NodeID != "" {
				t.Fatalf("round %d: both accepts refused, but the MAC is held by %q and the machine is %q as node %q", i, owner, d.Acceptance, d.NodeID)
			}
			for j := range 2 {
				if !errors.As(acceptErr[j], &conf) || !strings.Contains(acceptErr[j].Error(), "rejected") {
					t.Errorf("round %d: accept %d: %v, want a conflict saying the machine was rejected", i, j, acceptErr[j])
				}
				if _, err := st.Node(ctx, fmt.Sprintf("race-%d-%d", i, j), ""); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("round %d: the refused accept's node race-%d-%d exists (%v)", i, i, j, err)
				}
			}
			outcomes["rejected"]++
		}
		t.Logf("outcomes of %d rounds: %v", rounds, outcomes)
	})
}
