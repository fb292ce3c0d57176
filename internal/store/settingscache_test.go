package store

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"

	"bcd/internal/catalog"
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

// SQLite's writer keeps the images, signers, deploy profiles and hardware profiles it read: read
// again they run no statement, and a change to the table is read at once: a signer revoked
// refuses its image in the same write, a profile changed or removed is read as it is.
func TestWriterKeepsCatalogRowsUntilTheyChange(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	img := catalog.Image{Name: "img", URL: "http://127.0.0.1/img.raw", Size: 1, Format: "raw", Compression: "none", SHA256: strings.Repeat("ab", 32), Signer: "s"}
	img.Signature = catalog.Sign(img, key)
	// twice runs read twice, the second running no statement. A read that finds what it should
	// not is an error of the test at once, not of the write: the writer would run a write that
	// failed again, with its cache emptied, and a stale read would pass the second time.
	twice := func(tx *Tx, step string, read func() error) error {
		for i := range 2 {
			before := s.WriterStats().Statements
			if err := read(); err != nil {
				t.Errorf("%s (read %d): %v", step, i+1, err)
			}
			if ran := s.WriterStats().Statements - before; i == 1 && ran != 0 {
				t.Errorf("%s: read again, %d statements ran, want 0", step, ran)
			}
		}
		return nil
	}
	// The reads: each finds what it is given, and changes what it was handed (which must not
	// reach the next read).
	readImage := func(tx *Tx) error {
		got, err := tx.VerifiedImage(ctx, "img")
		if err == nil && got.SHA256 != img.SHA256 {
			err = fmt.Errorf("read %+v", got)
		}
		if err == nil && len(got.Signature) > 0 {
			got.Signature[0] ^= 0xff
		}
		return err
	}
	readProfile := func(want string) func(tx *Tx) error {
		return func(tx *Tx) error {
			d, ok, err := tx.Profile(ctx, "p")
			if err == nil && (ok != (want != "") || d != want) {
				err = fmt.Errorf("profile read %q %v, want %q", d, ok, want)
			}
			return err
		}
	}
	putHardware := func(power string) func(tx *Tx) error {
		return func(tx *Tx) error {
			return tx.PutHardwareProfile(ctx, HardwareProfile{Name: "h", Drivers: map[string]string{"power": power}})
		}
	}
	readHardware := func(power string) func(tx *Tx) error {
		return func(tx *Tx) error {
			hp, err := tx.HardwareProfile(ctx, "h")
			if err == nil && hp.Drivers["power"] != power {
				err = fmt.Errorf("read %+v", hp)
			}
			if err == nil {
				hp.Drivers["power"] = "changed by the caller"
			}
			return err
		}
	}
	steps := []struct {
		name  string
		write func(tx *Tx) error
		read  func(tx *Tx) error
	}{
		{"an image signed by a signer", func(tx *Tx) error {
			if err := tx.PutSigner(ctx, "s", pub); err != nil {
				return err
			}
			return tx.PutImage(ctx, img)
		}, readImage},
		{"the image replaced", func(tx *Tx) error {
			img.SHA256 = strings.Repeat("cd", 32)
			img.Signature = catalog.Sign(img, key)
			return tx.PutImage(ctx, img)
		}, readImage},
		{"its signer revoked", func(tx *Tx) error { return tx.RevokeSigner(ctx, "s") }, func(tx *Tx) error {
			if _, err := tx.VerifiedImage(ctx, "img"); err == nil {
				return errors.New("the image of a revoked signer verified")
			}
			return nil
		}},
		{"a deploy profile", func(tx *Tx) error { return tx.PutProfile(ctx, "p", `{"steps":["a"]}`) }, readProfile(`{"steps":["a"]}`)},
		{"changed", func(tx *Tx) error { return tx.PutProfile(ctx, "p", `{"steps":["b"]}`) }, readProfile(`{"steps":["b"]}`)},
		{"removed", func(tx *Tx) error { return tx.DeleteProfile(ctx, "p") }, readProfile("")},
		{"a hardware profile", putHardware("redfish"), readHardware("redfish")},
		{"its drivers changed", putHardware("ipmi"), readHardware("ipmi")},
	}
	for _, step := range steps {
		for _, where := range []string{"in the write", "after it"} {
			if err := s.Write(ctx, func(tx *Tx) error {
				if where == "in the write" {
					if err := step.write(tx); err != nil {
						return err
					}
				}
				return twice(tx, step.name+" ("+where+")", func() error { return step.read(tx) })
			}); err != nil {
				t.Fatalf("%s (%s): %v", step.name, where, err)
			}
		}
	}
}

// SQLite's writer keeps a workflow's plan with no statement while it knows the plan there and
// used within planTouchEvery; a plan whose row changed (purged, or its use long ago) is kept by
// the statements again: inserted back, or moved on.
func TestWriterKeepsAPlanItKnowsWithoutAStatement(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	w := &Workflow{Steps: `[{"use":"a"}]`, Cleanup: `[]`}
	plan := planDigest(w.Steps, w.Cleanup)
	usedAt := func(tx *Tx) int64 {
		var at int64
		if err := tx.queryRow(ctx, `SELECT used_at FROM workflow_plans WHERE digest = ?`, plan).Scan(&at); err != nil {
			t.Errorf("reading the plan: %v", err)
		}
		return at
	}
	for _, step := range []struct {
		name    string
		before  string // a statement on the plan's row first ("" none)
		ran     bool   // keepPlan runs statements
		touched bool   // the row's used_at is the write's time after it
	}{
		{"a new plan", "", true, true},
		{"kept again", "", false, true},
		{"its row removed", `DELETE FROM workflow_plans WHERE digest = ?`, true, true},
		{"used long ago", `UPDATE workflow_plans SET used_at = 1 WHERE digest = ?`, true, true},
		{"kept again, used just now", "", false, true},
	} {
		if err := s.Write(ctx, func(tx *Tx) error {
			if step.before != "" {
				if _, err := tx.exec(ctx, step.before, plan); err != nil {
					return err
				}
			}
			before := s.WriterStats().Statements
			if err := tx.keepPlan(ctx, tx.rows(), plan, w, "test"); err != nil {
				return err
			}
			if ran := s.WriterStats().Statements - before; (ran > 0) != step.ran {
				t.Errorf("%s: %d statements ran, want some: %v", step.name, ran, step.ran)
			}
			if at := usedAt(tx); step.touched && at < tx.at-planTouchEvery {
				t.Errorf("%s: the plan's used_at is %d, more than planTouchEvery before %d", step.name, at, tx.at)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
	}
}
