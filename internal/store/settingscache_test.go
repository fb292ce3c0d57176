package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// SQLite's writer keeps the pools and approvals policies it read: read again they run no
// statement; any change to either table (by this write, a later one, or one rolled back) is read
// as it is stored; and a pool handed out has maps of its own.
func TestWriterKeepsPoolsAndPoliciesUntilTheyChange(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	pool, site := node.PoolID, node.SiteID
	// check reads the pool (by id and by name) and the policies twice each: the second reads run
	// no statement, and every read says what the tables hold now.
	check := func(tx *Tx, step string, wantLabel string, wantAny bool, wantRequired int) error {
		var name string
		if err := tx.queryRow(ctx, `SELECT name FROM pools WHERE id = ?`, pool).Scan(&name); err != nil {
			return err
		}
		for i := range 2 {
			before := s.WriterStats().Statements
			for _, ref := range []string{pool, name} {
				p, err := tx.Pool(ctx, ref)
				if err != nil {
					return fmt.Errorf("%s: pool %s: %w", step, ref, err)
				}
				if got := p.Policy.Labels["rack"]; got != wantLabel {
					t.Errorf("%s: pool read by %s (read %d) has rack %q, want %q", step, ref, i+1, got, wantLabel)
				}
				if p.Policy.Labels != nil {
					p.Policy.Labels["rack"] = "changed by the caller" // (must not reach the next read)
				}
			}
			some, err := tx.AnyApprovalPolicy(ctx)
			if err != nil {
				return err
			}
			required, err := tx.RequiredApprovals(ctx, site, pool)
			if err != nil {
				return err
			}
			if some != wantAny || required != wantRequired {
				t.Errorf("%s: policies (read %d): any %v, required %d; want %v, %d", step, i+1, some, required, wantAny, wantRequired)
			}
			if ran := s.WriterStats().Statements - before; i == 1 && ran != 0 {
				t.Errorf("%s: the second reads ran %d statements, want 0", step, ran)
			}
		}
		return nil
	}
	setRack := func(tx *Tx, rack string) error {
		p, err := tx.Pool(ctx, pool)
		if err != nil {
			return err
		}
		p.Policy.Labels = map[string]string{"rack": rack}
		return tx.UpdatePoolPolicy(ctx, pool, p.Policy)
	}
	undone := errors.New("undone")
	for _, step := range []struct {
		name         string
		write        func(tx *Tx) error
		fails        bool
		rack         string
		any          bool
		required     int
		checkInWrite bool
	}{
		{"as seeded", func(tx *Tx) error { return setRack(tx, "r1") }, false, "r1", false, 0, true},
		{"the pool's policy changed in the same write", func(tx *Tx) error { return setRack(tx, "r2") }, false, "r2", false, 0, true},
		{"a policy for the pool", func(tx *Tx) error { return tx.SetApprovalPolicy(ctx, ApprovalScope("pool", pool), 2, "test") }, false, "r2", true, 2, true},
		{"a larger one for the site", func(tx *Tx) error { return tx.SetApprovalPolicy(ctx, ApprovalScope("site", site), 3, "test") }, false, "r2", true, 3, true},
		{"changes undone", func(tx *Tx) error {
			if err := setRack(tx, "r3"); err != nil {
				return err
			}
			if err := tx.SetApprovalPolicy(ctx, ApprovalScope("site", site), 0, "test"); err != nil {
				return err
			}
			return undone
		}, true, "r2", true, 3, false},
		{"both removed", func(tx *Tx) error {
			if err := tx.SetApprovalPolicy(ctx, ApprovalScope("site", site), 0, "test"); err != nil {
				return err
			}
			return tx.SetApprovalPolicy(ctx, ApprovalScope("pool", pool), 0, "test")
		}, false, "r2", false, 0, true},
	} {
		err := s.Write(ctx, func(tx *Tx) error {
			if err := step.write(tx); err != nil {
				return err
			}
			if step.checkInWrite {
				return check(tx, step.name+" (in the write)", step.rack, step.any, step.required)
			}
			return nil
		})
		if (err != nil) != step.fails {
			t.Fatalf("%s: %v", step.name, err)
		}
		if err := s.Write(ctx, func(tx *Tx) error { return check(tx, step.name+" (after)", step.rack, step.any, step.required) }); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
	}
}
