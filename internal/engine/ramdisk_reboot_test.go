package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// newCSR is a new key's certificate request, as an agent makes one (a ramdisk at every boot).
func newCSR(t *testing.T) []byte {
	t.Helper()
	_, csr, err := pki.NewKeyAndCSR("agent")
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

// certFor issues agent a's certificate for the key of csr at now, as a join or a renewal does.
func certFor(t *testing.T, ca *pki.CA, a Agent, csr []byte, now time.Time) []byte {
	t.Helper()
	issue := func() ([]byte, error) { return ca.IssueNode(csr, a.NodeID, a.Generation, 7*24*time.Hour, now) }
	if a.Kind == "site" {
		issue = func() ([]byte, error) { return ca.IssueSiteAgent(csr, a.SiteID, a.ID, 90*24*time.Hour, now) }
	}
	der, err := issue()
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// A node's ramdisk acknowledges a wipe, and its machine is reset: a new boot of the ramdisk
// (a new key, the same agent id) connects within the departed boot's grace period. The wipe can
// never finish (the boot that ran it is gone with its journal in RAM): it is lost at once, and
// its step decides, instead of waiting for the wipe's deadline (a day); it is never offered to
// the new boot. A reconnect of the same boot (the same key, its certificate renewed or not)
// and a site agent's reconnect with another key leave the command running, as before.
func TestRamdiskRebootLosesWhatThePreviousBootAcknowledged(t *testing.T) {
	for _, tc := range []struct {
		name string
		// site: the command runs on the site agent instead (which resumes its journal).
		site bool
		// newKey: the second connection's certificate has another key; renewed: the same key
		// certified again.
		newKey, renewed bool
		// fin: the first connection ended (Disconnected) before the second came; else the
		// reset machine sent nothing.
		fin      bool
		wantLost bool
	}{
		{name: "new boot, no FIN", newKey: true, wantLost: true},
		{name: "new boot, connection ended", newKey: true, fin: true, wantLost: true},
		{name: "same boot reconnects", fin: true},
		{name: "same boot reconnects with its renewed certificate", renewed: true, fin: true},
		{name: "site agent reconnects with another key", site: true, newKey: true, fin: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				use, kind, args := "disk.wipe", "disk.wipe", map[string]string{"mode": "quick"}
				if tc.site {
					use, kind, args = "power.getPower", "bmc.query", nil
				}
				f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: use, Args: args, Timeout: 24 * time.Hour}}, nil, Config{AgentGrace: 15 * time.Second})
				ca, err := pki.CreateCA("test", f.clock.Now())
				if err != nil {
					t.Fatal(err)
				}
				f.run(t)
				first := Agent{ID: "node:" + f.node.ID, Kind: "node", NodeID: f.node.ID, Generation: f.node.IdentityGeneration, ConnID: "boot-1"}
				if tc.site {
					first = f.site
				}
				csr := newCSR(t)
				first.CertDER = certFor(t, ca, first, csr, f.clock.Now())
				if err := f.e.Connected(ctx, first, "v"); err != nil {
					t.Fatal(err)
				}
				cmds, err := f.e.Claim(ctx, first, 10)
				if err != nil || len(cmds) != 1 || cmds[0].Kind != kind {
					t.Fatalf("claimed %+v, %v; want one %s", cmds, err, kind)
				}
				id := cmds[0].ID
				if err := f.e.Ack(ctx, first, id); err != nil {
					t.Fatal(err)
				}
				if err := f.e.Report(ctx, first, Update{CommandID: id, State: "running"}); err != nil {
					t.Fatal(err)
				}
				deadline := f.commands(t, kind)[0].Deadline
				// The machine is reset; the ramdisk boots again and connects 5 s later, well
				// within the grace period.
				if tc.fin {
					if err := f.e.Disconnected(ctx, first); err != nil {
						t.Fatal(err)
					}
				}
				f.clock.Add(5 * time.Second)
				second := first
				second.ConnID = "boot-2"
				switch {
				case tc.newKey:
					second.CertDER = certFor(t, ca, second, newCSR(t), f.clock.Now())
				case tc.renewed:
					second.CertDER = certFor(t, ca, second, csr, f.clock.Now())
				}
				if err := f.e.Connected(ctx, second, "v"); err != nil {
					t.Fatal(err)
				}
				c, err := st.Command(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if !tc.wantLost {
					if c.State != "running" {
						t.Fatalf("after a reconnect that resumes its journal the command is %s, want running", c.State)
					}
					if again, err := f.e.Claim(ctx, second, 10); err != nil || len(again) != 0 {
						t.Fatalf("offered again on the reconnect: %+v (%v)", again, err)
					}
					return
				}
				if c.State != "lost" {
					t.Fatalf("after the new boot connected the command is %s, want lost (its deadline is %s away)",
						c.State, time.Duration(deadline-f.clock.Now().UnixMicro())*time.Microsecond)
				}
				if took := time.Duration(c.FinishedAt-c.DeliveredAt) * time.Microsecond; took > 10*time.Second {
					t.Errorf("lost %s after it was acknowledged, want at the new boot's connection (5 s)", took)
				}
				if wf := f.workflow(t); wf.State == wfRunning && wf.CurrentCommand == id {
					t.Errorf("the step still waits for the lost command")
				}
				// Never sent twice: the new boot is not offered it, and its acknowledgement
				// would be refused.
				again, err := f.e.Claim(ctx, second, 10)
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range again {
					if a.ID == id {
						t.Fatalf("the lost command was offered to the new boot")
					}
				}
				if err := f.e.Ack(ctx, second, id); !errors.Is(err, ErrFinished) {
					t.Fatalf("the new boot's ack of the lost command: %v, want refused as finished", err)
				}
				if n := f.e.CommandsLost(); n != 1 {
					t.Errorf("commands counted lost: %d, want 1", n)
				}
			})
		})
	}
}
