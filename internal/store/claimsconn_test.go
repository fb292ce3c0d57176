package store

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
)

// A claim's candidates, and an agent's pending cancels, read the same through the claims
// connection, which a read that finds it free uses, as through the read pool, which one uses
// while another read holds it: every column of every row, in the same order.
func TestClaimCandidatesReadTheSameOnEitherConnection(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	if err := s.Write(ctx, func(tx *Tx) error {
		for i, c := range []Command{
			{Kind: "bmc.query", Args: `{"query":"power"}`},
			{Kind: "bmc.power", Args: `{"action":"on"}`, TargetAgent: "a", Deadline: 1_700_000_000_000_000},
			{Kind: "boot.prepareRamdisk", Args: `{"macs":["02:00:00:00:00:01"]}`, Destructive: true},
			{Kind: "bmc.boot", Args: `{"device":"pxe"}`, TargetAgent: "a", Attempts: 2, Progress: `{"done":1}`},
			{Kind: "bmc.query", Args: `{}`, BatchID: "b1", WorkflowID: "w1", StepIndex: 3},
		} {
			c.NodeID, c.TenantID, c.SiteID, c.Subject, c.RunsOn = "n", "t", "s", "n", "site"
			c.Generation = uint64(i)
			if err := tx.InsertCommand(ctx, &c); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	read := func() []Command {
		t.Helper()
		cands, err := s.CommandCandidates(ctx, "a", "site", "s", "", 0, 10, true, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return cands
	}
	before := s.claims.statements.Load()
	viaClaims := read()
	if s.claims.statements.Load() == before {
		t.Error("a claim that found the claims connection free did not read through it")
	}
	s.claimsMu.Lock()
	before = s.claims.statements.Load()
	viaPool := read()
	after := s.claims.statements.Load()
	s.claimsMu.Unlock()
	if after != before {
		t.Error("a claim read through the claims connection while another held it")
	}
	if len(viaClaims) != 5 || !reflect.DeepEqual(viaClaims, viaPool) {
		t.Errorf("candidates through the claims connection:\n%+v\nthrough the read pool:\n%+v\nwant the same 5", viaClaims, viaPool)
	}

	// Two of them asked to be cancelled: the agent's pending cancels, through either.
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `UPDATE commands SET state = 'delivered', cancel_requested_at = 7 WHERE target_agent = 'a'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cancels := func() []Cancel {
		t.Helper()
		cs, err := s.PendingCancels(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	before = s.claims.statements.Load()
	freeCancels := cancels()
	if s.claims.statements.Load() == before {
		t.Error("pending cancels read with the claims connection free did not go through it")
	}
	s.claimsMu.Lock()
	heldCancels := cancels()
	s.claimsMu.Unlock()
	if len(freeCancels) != 2 || !reflect.DeepEqual(freeCancels, heldCancels) {
		t.Errorf("pending cancels through the claims connection %+v, through the read pool %+v: want the same 2", freeCancels, heldCancels)
	}
}

// A read made after the store closed gets an error, not a crash on the closed claims
// connection.
func TestHotReadsAfterCloseFail(t *testing.T) {
	s, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommandCandidates(context.Background(), "a", "site", "s", "", 0, 10, true, nil, 0); err == nil {
		t.Error("claim candidates read after the store closed: no error")
	}
	if _, err := s.PendingCancels(context.Background(), "a"); err == nil {
		t.Error("pending cancels read after the store closed: no error")
	}
}
