package metal_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/batch"
	"bcd/internal/catalog"
	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

var (
	alice = auth.Principal{Name: "alice", Role: auth.Approver}
	bob   = auth.Principal{Name: "bob", Role: auth.Approver}
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // generous: CI machines are shared
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// started runs a simulated site with n enrolled nodes, each resting ready.
func started(t *testing.T, st *store.Store, cfg sim.Config, ecfg engine.Config, n int) (*sim.Harness, []string) {
	t.Helper()
	ctx := context.Background()
	ecfg.Poll, ecfg.AgentGrace = 20*time.Millisecond, 300*time.Millisecond
	h, err := sim.Start(ctx, st, cfg, ecfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	ids, err := h.Enroll(ctx, "a", n)
	if err != nil {
		t.Fatal(err)
	}
	for id, node := range rested(t, h, ids) {
		if node.State != "ready" {
			t.Fatalf("node %s enrolled %s %s %s", id, node.State, node.FaultCode, node.FaultMsg)
		}
	}
	return h, ids
}

func rested(t *testing.T, h *sim.Harness, ids []string) map[string]store.Node {
	t.Helper()
	got, err := h.WaitRest(context.Background(), ids, 60*time.Second)
	if err != nil {
		for _, id := range ids {
			evs, _ := h.Store.Events(context.Background(), store.EventFilter{NodeID: id, Limit: 500})
			for _, e := range evs {
				t.Logf("%s %s %s→%s %s %s", id, e.Kind, e.FromState, e.ToState, e.Reason, e.Data)
			}
		}
		t.Fatal(err)
	}
	return got
}

// replaceImage replaces catalog image name by another, validly signed, that writes other bytes.
func replaceImage(t *testing.T, h *sim.Harness, name string) catalog.Image {
	t.Helper()
	ctx := context.Background()
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Metal.AddSigner(ctx, h.Admin, "other", pub); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(name + " rebuilt"))
	img := catalog.Image{Name: name, URL: "http://images.sim/" + name + "-rebuilt.raw.zst", Size: 1 << 30, Format: "raw", Compression: "zstd",
		SHA256: hex.EncodeToString(sum[:]), Signer: "other"}
	img.Signature = catalog.Sign(img, key)
	if err := h.Metal.AddImage(ctx, h.Admin, img); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestDeployWritesThePinnedImage: a deploy pins its image's digest when the verb is applied. A
// catalog image replaced afterwards (same name, other bytes) is not written: under an approval
// policy the batch shows what its approvers approve (name and digest) and approving it writes
// nothing else; without one the in-flight deploy does not silently change either. The step
// fails naming both digests and no image-write command is sent.
func TestDeployWritesThePinnedImage(t *testing.T) {
	cases := []struct {
		name     string
		required int
		latency  time.Duration // slow agents: the replacement lands before the image write
	}{
		{"under approval", 1, 0},
		{"without approval", 0, 300 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			st := storetest.Open(t, store.SQLite)
			h, ids := started(t, st, sim.Config{Latency: c.latency}, engine.Config{}, 1)
			if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", c.required); err != nil {
				t.Fatal(err)
			}
			asked, err := h.Store.Image(ctx, "debian-12")
			if err != nil {
				t.Fatal(err)
			}
			pinned := "sha256:" + asked.SHA256
			if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbDeploy, metal.VerbInput{Node: ids[0], Image: "debian-12", Reason: "lease"}); err != nil {
				t.Fatal(err)
			}
			var b store.Batch
			if c.required > 0 {
				waitFor(t, "the deploy's batch", func() bool {
					n, err := st.Node(ctx, ids[0], "")
					if err != nil || n.BatchID == "" {
						return false
					}
					b, err = st.Batch(ctx, n.BatchID)
					return err == nil
				})
				if b.State != store.BatchPending || b.Image != "debian-12" || b.ImageDigest != pinned {
					t.Fatalf("batch %s: image %q digest %q, want pending, debian-12 %s", b.State, b.Image, b.ImageDigest, pinned)
				}
			}
			now := replaceImage(t, h, "debian-12")
			if c.required > 0 {
				if _, err := h.Metal.Approve(ctx, alice, b.ID, "ok"); err != nil {
					t.Fatal(err)
				}
			}
			h.Engine.Nudge()
			n := rested(t, h, ids)[ids[0]]
			if n.State != "failed" || !strings.Contains(n.FaultMsg, pinned) || !strings.Contains(n.FaultMsg, "sha256:"+now.SHA256) {
				t.Fatalf("node %s %s %q: want failed naming %s and sha256:%s", n.State, n.FaultCode, n.FaultMsg, pinned, now.SHA256)
			}
			cmds, err := st.Commands(ctx, ids[0], 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, cmd := range cmds {
				if cmd.Kind == "deploy.image" {
					t.Fatalf("an image-write command was queued (%s, %s) for a replaced image", cmd.ID, cmd.State)
				}
			}
		})
	}
}

// stoppedSite is a site whose one node rests ready, with its simulated agents stopped and an
// engine that does not run by itself (the test claims for the site agent and sweeps): nothing
// happens unless the test asks.
func stoppedSite(t *testing.T, ecfg engine.Config) (*sim.Harness, *engine.Engine, engine.Agent, string) {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := started(t, st, sim.Config{}, engine.Config{}, 1)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	h.Stop()
	eng := engine.New(st, h.CA, quiet(), ecfg)
	a := engine.Agent{ID: "sim-site-1", Kind: "site", SiteID: h.SiteID}
	if err := eng.Connected(ctx, a, "test"); err != nil {
		t.Fatal(err)
	}
	return h, eng, a, ids[0]
}

// TestDirectBatchExpires: a one-command batch (an operator's power action, a BMC credential
// rotation) not approved within the approval timeout expires like any other: approving it
// then is refused ("expired at"), the sweep rejects it as the system and fails its held
// command with the reason, and a rotation records itself failed. A server whose timeout is
// longer may have approved it meanwhile: the queue sends nothing of it all the same.
func TestDirectBatchExpires(t *testing.T) {
	const timeout = 200 * time.Millisecond
	cases := []struct {
		name string
		// serviceTimeout: the API's approval timeout (0: the same as the engine's).
		serviceTimeout time.Duration
		rotate         bool
	}{
		{"power action", 0, false},
		{"rotation", 0, true},
		{"approved late by a server with a longer timeout", time.Hour, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			h, eng, a, node := stoppedSite(t, engine.Config{ApprovalTimeout: timeout})
			st := h.Store
			h.Metal.SetApprovalTimeout(timeout)
			if c.serviceTimeout != 0 {
				h.Metal.SetApprovalTimeout(c.serviceTimeout)
			}
			var cmdID string
			if c.rotate {
				res, err := h.Metal.RotateBmcCredential(ctx, h.Admin, node, "quarterly")
				if err != nil {
					t.Fatal(err)
				}
				cmdID = res.CommandID
			} else {
				var err error
				if _, cmdID, err = h.Metal.Apply(ctx, h.Admin, provision.VerbPower, metal.VerbInput{Node: node, PowerAction: "off", Reason: "x"}); err != nil {
					t.Fatal(err)
				}
			}
			cmd, err := st.Command(ctx, cmdID)
			if err != nil || cmd.State != "held" || cmd.BatchID == "" {
				t.Fatalf("command %+v %v: want held under a batch", cmd, err)
			}
			b, err := st.Batch(ctx, cmd.BatchID)
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.UnixMicro(batch.Deadline(b, timeout))
			waitFor(t, "the approval deadline to pass", func() bool { return time.Now().After(deadline.Add(10 * time.Millisecond)) })

			if c.serviceTimeout == 0 {
				if _, err := h.Metal.Approve(ctx, alice, b.ID, "late"); err == nil || !strings.Contains(err.Error(), "expired at") {
					t.Fatalf("approving past the deadline: %v, want refused (expired at …)", err)
				}
			} else {
				if _, err := h.Metal.Approve(ctx, alice, b.ID, "late"); err != nil {
					t.Fatalf("the longer-timeout server refused: %v", err)
				}
				if got, err := eng.Claim(ctx, a, 10); err != nil || len(got) != 0 {
					t.Fatalf("claim after a late approval: %d commands %v, want none", len(got), err)
				}
				cmd, _ = st.Command(ctx, cmdID)
				if cmd.State != "failed" || !strings.Contains(cmd.Error, "after it expired") {
					t.Fatalf("late-approved command %s: %q", cmd.State, cmd.Error)
				}
				return
			}
			n, err := eng.ExpireBatches(ctx)
			if err != nil || n != 1 {
				t.Fatalf("sweep expired %d batches, %v; want 1", n, err)
			}
			if b, err = st.Batch(ctx, b.ID); err != nil || b.State != store.BatchRejected || b.DecidedBy != "system" || !strings.Contains(b.DecisionReason, "not approved within") {
				t.Fatalf("batch %s by %s: %q %v", b.State, b.DecidedBy, b.DecisionReason, err)
			}
			cmd, _ = st.Command(ctx, cmdID)
			if cmd.State != "failed" || !strings.Contains(cmd.Error, "expired at") {
				t.Fatalf("held command %s: %q", cmd.State, cmd.Error)
			}
			if got, err := eng.Claim(ctx, a, 10); err != nil || len(got) != 0 {
				t.Fatalf("claim after expiry: %d commands %v, want none", len(got), err)
			}
			evs, _ := st.Events(ctx, store.EventFilter{Limit: 1000})
			var kinds []string
			for _, e := range evs {
				if e.Actor == "system" {
					kinds = append(kinds, e.Kind)
				}
			}
			if !slices.Contains(kinds, "batch.reject") || !slices.Contains(kinds, "command.refused") {
				t.Fatalf("system events %v: want batch.reject and command.refused", kinds)
			}
			if n, err := eng.ExpireBatches(ctx); err != nil || n != 0 {
				t.Fatalf("second sweep expired %d, %v", n, err)
			}
			if c.rotate {
				if _, err := eng.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
				vs, err := st.CredentialVersions(ctx, node)
				if err != nil {
					t.Fatal(err)
				}
				if len(vs) == 0 || vs[0].State != store.CredFailed || !strings.Contains(vs[0].Error, "expired") {
					t.Fatalf("rotation versions %+v: want the newest failed, expired", vs)
				}
			}
		})
	}
}

// TestWithdrawHoldsTheCommandAgain: an approval withdrawn below the quorum before the batch's
// command was sent holds the command again (it waits for approvals, as before), rather than
// leaving it queued for the gate to fail; approved again, it is sent.
func TestWithdrawHoldsTheCommandAgain(t *testing.T) {
	ctx := context.Background()
	h, eng, a, node := stoppedSite(t, engine.Config{})
	st := h.Store
	_, cmdID, err := h.Metal.Apply(ctx, h.Admin, provision.VerbPower, metal.VerbInput{Node: node, PowerAction: "off", Reason: "x"})
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := st.Command(ctx, cmdID)
	if _, err := h.Metal.Approve(ctx, alice, cmd.BatchID, "ok"); err != nil {
		t.Fatal(err)
	}
	if cmd, _ = st.Command(ctx, cmdID); cmd.State != "queued" {
		t.Fatalf("approved: command %s, want queued", cmd.State)
	}
	b, err := h.Metal.Withdraw(ctx, alice, cmd.BatchID, "wrong node")
	if err != nil {
		t.Fatal(err)
	}
	if cmd, _ = st.Command(ctx, cmdID); b.State != store.BatchPending || cmd.State != "held" {
		t.Fatalf("withdrawn: batch %s, command %s %q; want pending and held", b.State, cmd.State, cmd.Error)
	}
	if got, err := eng.Claim(ctx, a, 10); err != nil || len(got) != 0 {
		t.Fatalf("claim while held: %d commands %v", len(got), err)
	}
	if cmd, _ = st.Command(ctx, cmdID); cmd.State != "held" {
		t.Fatalf("after a claim: command %s %q, want still held", cmd.State, cmd.Error)
	}
	if _, err := h.Metal.Approve(ctx, bob, cmd.BatchID, "right node after all"); err != nil {
		t.Fatal(err)
	}
	got, err := eng.Claim(ctx, a, 10)
	if err != nil || len(got) != 1 || got[0].ID != cmdID {
		t.Fatalf("claim after approving again: %v %v", got, err)
	}
}

// TestInbandEnrollUnderApprovals: with an approvals policy, a machine accepted --inband (no
// BMC address until its ramdisk provisions the BMC) is enrolled as an operator does it:
// accept, approve what is asked, and the node ends ready with its BMC's address. The
// credential provisioning (run by the ramdisk) is approved with the node as its subject; the
// BMC work that follows is approved in a batch that names the BMC by the address it reported.
func TestInbandEnrollUnderApprovals(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := sim.Start(ctx, st, sim.Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		if _, err := h.Metal.CreatePool(ctx, h.Admin, "ipmi", "default", store.PoolPolicy{HardwareProfile: "ipmi"}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "ipmi", 1); err != nil {
			t.Fatal(err)
		}
		const (
			mac  = "52:54:00:bc:00:01"
			uuid = "99999999-1111-4222-8333-0000000000b1"
			addr = "10.77.0.9:6230"
		)
		now := time.Now()
		site := engine.Agent{ID: "sim-site-1", Kind: "site", SiteID: h.SiteID}
		if err := h.Engine.RecordDiscovered(ctx, site, []engine.Discovery{{MAC: mac, UUID: uuid, FirstSeen: now, LastSeen: now,
			Inventory: `{"bootMac":"` + mac + `","systemUuid":"` + uuid + `","macs":["` + mac + `"]}`}}); err != nil {
			t.Fatal(err)
		}
		n, err := h.Metal.AcceptDiscovered(ctx, h.Admin, metal.AcceptInput{Site: "default", MAC: mac, Pool: "ipmi", Name: "inb-approved", BMC: metal.BMCInput{Inband: true}})
		if err != nil {
			t.Fatal(err)
		}
		h.Sim.Add(&sim.Machine{NodeID: n.ID, UUID: uuid, MACs: []string{mac}, Discovering: true, InbandBMC: addr})
		h.Engine.Nudge()

		// The operator approves each batch the node asks for, until it rests.
		approved := map[string]store.Batch{}
		waitFor(t, "the in-band node to rest", func() bool {
			list, err := h.Metal.PendingBatches(ctx, h.Admin, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range list {
				if _, err := h.Metal.Approve(ctx, alice, b.ID, "enroll"); err != nil {
					t.Fatal(err)
				}
				approved[b.ID] = b
				h.Engine.Nudge()
			}
			node, err := st.Node(ctx, n.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			return node.TargetState == "" || node.State == "failed"
		})
		node := rested(t, h, []string{n.ID})[n.ID]
		if node.State != "ready" || node.BMCAddress != addr {
			t.Fatalf("in-band node under approvals: %s %s %q, BMC %q", node.State, node.FaultCode, node.FaultMsg, node.BMCAddress)
		}
		if len(approved) == 0 {
			t.Fatal("nothing was asked to be approved: the policy did not apply")
		}
		// Every leaf that names a BMC names it by its address; the in-band provisioning's is the node.
		var provision, bmcWork bool
		for id := range approved {
			_, leaves, err := h.Metal.Batch(ctx, h.Admin, id, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range leaves {
				if strings.HasPrefix(l.Subject, "bmc:") && !strings.HasSuffix(l.Subject, "/"+addr) {
					t.Errorf("batch %s leaf %s %s names no BMC address", id, l.Subject, l.Kind)
				}
				provision = provision || l.Kind == "bmc.provisionInband" && l.Subject == n.ID
				bmcWork = bmcWork || strings.HasPrefix(l.Subject, "bmc:")
			}
		}
		if !provision || !bmcWork {
			t.Errorf("approved batches cover the in-band provisioning on the node: %v; BMC work by address: %v", provision, bmcWork)
		}
		evs, _ := st.Events(ctx, store.EventFilter{NodeID: n.ID, Limit: 1000})
		for _, e := range evs {
			if e.Kind == "command.refused" {
				t.Errorf("refused: %s", e.Reason)
			}
		}
	})
}
