package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
	"unsafe"
)

// fillNode sets every field of n to a value made of tag and the field's name (strings, maps,
// slices), to seed (numbers) or to true (flags).
func fillNode(t *testing.T, n *Node, tag string, seed int64) {
	t.Helper()
	v := reflect.ValueOf(n).Elem()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.String:
			f.SetString(tag + "-" + name)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int64:
			f.SetInt(seed + int64(i))
		case reflect.Uint64:
			f.SetUint(uint64(seed) + uint64(i))
		case reflect.Map:
			f.Set(reflect.ValueOf(map[string]string{tag: name}))
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{tag + "-" + name}))
		default:
			t.Fatalf("Node.%s is a %s: fillNode (and the writer's node cache, packNode) must learn it", name, f.Kind())
		}
	}
}

// A node packed for the writer's cache unpacks as it was, every field of it: a field added to
// Node and not to nodeTexts or nodeNums comes back empty and fails this.
func TestNodePackedAsItWas(t *testing.T) {
	var n Node
	fillNode(t, &n, "a", 7)
	x := nodeTextCols{drivers: labelsJSON(n.Drivers), labels: labelsJSON(n.Labels), macs: mustJSON(n.MACs), conds: labelsJSON(n.Conditions)}
	e := packNode(n, x, 42)
	got, gotX, err := e.unpack(n.ID, new(textCache))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, n) {
		t.Errorf("unpacked\n %+v\nwant\n %+v", got, n)
	}
	if x.gen, x.ver = int64(n.IdentityGeneration), int64(n.Version); gotX != x || e.rowid() != 42 {
		t.Errorf("unpacked columns %+v at row %d, want %+v at 42", gotX, e.rowid(), x)
	}
	// None of its strings is a slice of the entry's text, which would keep the whole row alive
	// as long as the string: an id kept by a command or an event, a label's value.
	lo := uintptr(unsafe.Pointer(unsafe.StringData(e.text)))
	hi := lo + uintptr(len(e.text))
	inText := func(v string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(v)))
		return len(v) > 0 && p >= lo && p < hi
	}
	v := reflect.ValueOf(got)
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		var strs []string
		switch f.Kind() {
		case reflect.String:
			strs = []string{f.String()}
		case reflect.Map:
			for _, k := range f.MapKeys() {
				strs = append(strs, k.String(), f.MapIndex(k).String())
			}
		case reflect.Slice:
			strs = f.Interface().([]string)
		}
		for _, s := range strs {
			if inText(s) {
				t.Errorf("Node.%s holds %q, a slice of the cache's entry", name, s)
			}
		}
	}
	// Unpacked twice, the node's maps are its own: a caller that changes them changes no other.
	again, _, _ := e.unpack(n.ID, new(textCache))
	again.Labels["b"], again.MACs[0] = "changed", "changed"
	if got, _, _ := e.unpack(n.ID, new(textCache)); !reflect.DeepEqual(got, n) {
		t.Errorf("a change to an unpacked node's maps reached the cache: %+v", got)
	}
}

// SQLite's writer keeps the nodes it inserted, read or changed (workflowCache.nodes): after each
// kind of change, by the statements that put the row back and by others the cache must drop it
// for, every row the cache holds is the row the database holds, and it holds the rows the step
// says.
func TestWriterNodeCacheHoldsWhatTheDatabaseHolds(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	ids := map[string]string{"n": node.ID}
	var other Node
	lock := func(tx *Tx, name string) (Node, error) { return tx.LockNode(ctx, ids[name], "") }
	errUndone := errors.New("undone")
	steps := []cacheStep{ // (cached: the nodes the cache holds after the step)
		{"a node inserted by another statement", func(tx *Tx) error {
			pool, err := tx.Pool(ctx, node.PoolID)
			if err != nil {
				return err
			}
			other = redfishNode(pool, "o", "ready")
			ids["o"] = other.ID
			_, err = tx.exec(ctx, `INSERT INTO nodes (id, tenant_id, site_id, pool_id, name, state, hardware_profile, bmc_driver, bmc_address,
				bmc_username_ref, bmc_password_ref, created_at, updated_at) SELECT ?, tenant_id, site_id, pool_id, ?, state, hardware_profile,
				bmc_driver, bmc_address, bmc_username_ref, bmc_password_ref, created_at, updated_at FROM nodes WHERE id = ?`, other.ID, other.Name, node.ID)
			return err
		}, false, []string{"n"}},
		{"read", func(tx *Tx) error { _, err := lock(tx, "o"); return err }, false, []string{"n", "o"}},
		{"every column changed, state and batch too", func(tx *Tx) error {
			n, err := lock(tx, "n")
			if err != nil {
				return err
			}
			id, version := n.ID, n.Version
			fillNode(t, &n, "b", 100)
			n.ID, n.Version = id, version
			return tx.UpdateNode(ctx, &n)
		}, false, []string{"n", "o"}},
		{"changed again, state and batch kept", func(tx *Tx) error {
			n, err := lock(tx, "n")
			if err != nil {
				return err
			}
			n.TargetState, n.Conditions, n.Power = "deployed", map[string]string{"c": "d"}, "on"
			if err := tx.UpdateNode(ctx, &n); err != nil {
				return err
			}
			if _, ok := tx.nodes[n.ID]; !ok {
				return errors.New("the update did not record the node's indexed columns")
			}
			n.FaultCode = "twice in one transaction"
			return tx.UpdateNode(ctx, &n)
		}, false, []string{"n", "o"}},
		{"an update at a version that is gone", func(tx *Tx) error {
			n, err := lock(tx, "n")
			if err != nil {
				return err
			}
			n.Version--
			n.Name = "stale"
			if err := tx.UpdateNode(ctx, &n); !errors.Is(err, ErrStale) {
				return errors.New("a stale update was not refused")
			}
			return nil
		}, false, []string{"n", "o"}},
		{"power recorded", func(tx *Tx) error { return tx.SetPower(ctx, ids["o"], "off") }, false, []string{"n", "o"}},
		{"deploy image pinned", func(tx *Tx) error { return tx.PinDeployImage(ctx, ids["n"], "sha256:ab") }, false, []string{"n", "o"}},
		{"another statement changes a node", func(tx *Tx) error { return tx.SetProductUUID(ctx, ids["o"], "AB-CD") }, false, []string{"n"}},
		{"read again", func(tx *Tx) error { _, err := lock(tx, "o"); return err }, false, []string{"n", "o"}},
		{"read by name", func(tx *Tx) error {
			if _, err := tx.exec(ctx, `UPDATE nodes SET bmc_fingerprint = 'f' WHERE id = ?`, ids["o"]); err != nil { // (dropped)
				return err
			}
			n, err := tx.LockNode(ctx, "o", "")
			if err == nil && n.ID != ids["o"] {
				err = errors.New("read another node")
			}
			return err
		}, false, []string{"n"}},
		{"read in another tenant", func(tx *Tx) error {
			if _, err := tx.LockNode(ctx, ids["n"], "another"); !errors.Is(err, ErrNotFound) {
				return errors.New("a node of another tenant was found")
			}
			return nil
		}, false, []string{"n"}},
		{"an update, then the write fails", func(tx *Tx) error {
			n, err := lock(tx, "n")
			if err != nil {
				return err
			}
			n.FaultCode = "undone"
			if err := tx.UpdateNode(ctx, &n); err != nil {
				return err
			}
			return errUndone
		}, true, nil},
		{"both read again", func(tx *Tx) error {
			for _, name := range []string{"n", "o"} {
				if _, err := lock(tx, name); err != nil {
					return err
				}
			}
			return nil
		}, false, []string{"n", "o"}},
		{"a statement of many nodes", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE nodes SET bmc_fingerprint = 'x'`)
			return err
		}, false, nil},
		{"a node read, then removed", func(tx *Tx) error {
			n, err := lock(tx, "o")
			if err != nil {
				return err
			}
			return tx.DeleteNode(ctx, n)
		}, false, nil},
	}
	// Every cached row is the stored one, and the cache holds what the step says.
	runCacheSteps(t, s, ids, steps, func(tx *Tx, step string) (held []string) {
		for id, e := range tx.rows().nodes.byKey {
			var stored Node
			var x nodeTextCols
			var row int64
			if err := scanNodeInto(tx.queryRow(ctx, nodeRowQuery, id, "", ""), &stored, &x, nil, &row); err != nil {
				t.Errorf("%s: cached node %s: %v", step, id, err)
				continue
			}
			got, gotX, err := e.unpack(id, new(textCache))
			if err != nil {
				t.Errorf("%s: cached node %s: %v", step, id, err)
				continue
			}
			if !reflect.DeepEqual(got, stored) || gotX != x || e.row != row {
				t.Errorf("%s: cached node %s at row %d\n %+v\n %+v\nstored at row %d\n %+v\n %+v", step, id, e.row, got, gotX, row, stored, x)
			}
			held = append(held, id)
		}
		return held
	})
}

// A node the writer holds is read without a statement, a copy of its own each time.
func TestWriterReadsACachedNodeWithoutAStatement(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	hits := s.WriterStats().NodeHits
	if err := s.Write(ctx, func(tx *Tx) error {
		before := s.WriterStats().Statements
		n, err := tx.LockNode(ctx, node.ID, node.TenantID)
		if err != nil {
			return err
		}
		if ran := s.WriterStats().Statements - before; ran != 0 {
			t.Errorf("a read of a node the writer inserted ran %d statements, want 0", ran)
		}
		n.Labels["x"] = "y"
		again, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		if _, ok := again.Labels["x"]; ok || again.Name != node.Name || again.Version != node.Version {
			t.Errorf("read again: %+v, want the node as inserted", again)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := s.WriterStats().NodeHits - hits; got != 2 {
		t.Errorf("%d reads found in the cache, want 2", got)
	}
}

// A power the node already has, as the writer's cache holds its row, runs no statement; another
// does, and lands; a node the cache does not hold runs the statement whatever its power.
func TestSetPowerTheNodeHasRunsNoStatement(t *testing.T) {
	var n Node
	var x nodeTextCols
	if nodeTexts(&n, &x)[nodePowerText] != &n.Power {
		t.Fatal("nodePowerText is not the power's place in nodeTexts")
	}
	ctx := context.Background()
	s, node := openWithNode(t)
	if err := s.Write(ctx, func(tx *Tx) error {
		power := func() string {
			var p string
			if err := tx.queryRow(ctx, `SELECT power FROM nodes WHERE id = ?`, node.ID).Scan(&p); err != nil {
				t.Error(err)
			}
			return p
		}
		for _, c := range []struct {
			name     string
			power    string
			uncached bool
			ran      bool
		}{
			{"the power it has", node.Power, false, false},
			{"another power", "on", false, true},
			{"that power again", "on", false, false},
			{"the power it has, not cached", "on", true, true},
			{"back", "off", false, true},
		} {
			if c.uncached {
				tx.rows().takeNode(node.ID)
			}
			before := s.WriterStats().Statements
			if err := tx.SetPower(ctx, node.ID, c.power); err != nil {
				return err
			}
			if ran := s.WriterStats().Statements - before; (ran > 0) != c.ran {
				t.Errorf("%s: %d statements ran, want some: %v", c.name, ran, c.ran)
			}
			if got := power(); got != c.power {
				t.Errorf("%s: the row's power is %q, want %q", c.name, got, c.power)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkWriterNodeRead: reads of nodes by id in SQLite's writer among 10 000 nodes, in no
// order, 100 a write: from the writer's cache (cached=true) and from their rows (the entry
// dropped before each read). It reports the writer thread's CPU per read.
func BenchmarkWriterNodeRead(b *testing.B) {
	ctx := context.Background()
	s := openTempSQLite(b)
	const n = 10000
	ids := make([]string, 0, n)
	for i := 0; i < n; i += 1000 {
		if err := s.Write(ctx, func(tx *Tx) error {
			pool, err := seedOrReadPool(ctx, tx)
			if err != nil {
				return err
			}
			for j := range 1000 {
				node := redfishNode(pool, fmt.Sprint("n", i+j), "ready")
				node.MACs, node.Labels = []string{fmt.Sprintf("02:00:00:00:%02x:%02x", (i+j)/256, (i+j)%256)}, map[string]string{"rack": "r1"}
				if err := tx.InsertNode(ctx, &node); err != nil {
					return err
				}
				ids = append(ids, node.ID)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	for _, cached := range []bool{true, false} {
		b.Run(fmt.Sprint("cached=", cached), func(b *testing.B) {
			i := 0
			var cpu time.Duration
			for b.Loop() {
				if err := s.Write(ctx, func(tx *Tx) error {
					c0, _ := threadCPU()
					for range 100 {
						i++
						id := ids[(i*7919)%n]
						if !cached {
							tx.rows().takeNode(id)
						}
						if _, err := tx.LockNode(ctx, id, ""); err != nil {
							return err
						}
					}
					c1, _ := threadCPU()
					cpu += c1 - c0
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*100), "writer-ns/read")
		})
	}
}

// seedOrReadPool is seedPool's pool, seeded at the first call.
func seedOrReadPool(ctx context.Context, tx *Tx) (Pool, error) {
	if p, err := tx.Pool(ctx, "p"); err == nil {
		return p, nil
	}
	return seedPool(ctx, tx)
}
