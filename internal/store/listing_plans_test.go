package store

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// openEachEngine opens a fresh store of each engine (PostgreSQL when BCD_TEST_POSTGRES_DSN is
// set), closed when the test ends: storetest, which the tests outside the package use, imports
// this package.
func openEachEngine(t *testing.T) map[Engine]*Store {
	t.Helper()
	ctx := context.Background()
	out := map[Engine]*Store{}
	s, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	out[SQLite] = s
	base := os.Getenv("BCD_TEST_POSTGRES_DSN")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("BCD_TEST_POSTGRES_DSN is not set under CI")
		}
		return out
	}
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("t_plans_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	p, err := Open(ctx, base+sep+"search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	out[Postgres] = p
	return out
}

// planOf is how the store's engine runs q with args: SQLite's query plan, or PostgreSQL's
// generic plan (the one a prepared statement ends up with, whatever its arguments).
func planOf(t *testing.T, s *Store, q string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := s.read.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	query, explain := "EXPLAIN QUERY PLAN "+q, args
	if s.engine == Postgres {
		if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
		defer conn.ExecContext(ctx, "RESET plan_cache_mode")
		if _, err := conn.ExecContext(ctx, "PREPARE planned AS "+s.bind(q)); err != nil {
			t.Fatal(err)
		}
		defer conn.ExecContext(ctx, "DEALLOCATE planned")
		// EXECUTE takes its arguments as literals, not as parameters.
		lits := make([]string, len(args))
		for i, a := range args {
			switch a := a.(type) {
			case string:
				lits[i] = "'" + strings.ReplaceAll(a, "'", "''") + "'"
			default:
				lits[i] = fmt.Sprint(a)
			}
		}
		query, explain = "EXPLAIN EXECUTE planned", nil
		if len(lits) > 0 {
			query += "(" + strings.Join(lits, ", ") + ")"
		}
	}
	rows, err := conn.QueryContext(ctx, query, explain...)
	if err != nil {
		t.Fatalf("explaining %s: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, fmt.Sprint(vals[len(vals)-1]))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "; ")
}

// A node's events are read through events_node, not by reading the events table (every event
// of every node, for ever) in id order until enough of the node's turn up: the API lists a
// node's events, and follows them, with these queries.
func TestEventListingsUseTheNodeIndex(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			// Enough events, over enough nodes, that reading them all costs more than a
			// node's few.
			const nodes, perNode = 2000, 10
			evs := make([]Event, 0, nodes*perNode)
			for i := range nodes * perNode {
				evs = append(evs, Event{TenantID: "tn", NodeID: fmt.Sprintf("node-%04d", i%nodes), Actor: "test", Kind: "node.test"})
			}
			if err := s.Write(ctx, func(tx *Tx) error { return tx.AppendEvents(ctx, evs) }); err != nil {
				t.Fatal(err)
			}
			if _, err := s.write.ExecContext(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
			cases := []struct {
				name string
				q    string
				args []any
			}{}
			for _, f := range []EventFilter{
				{NodeID: "node-0007", Limit: 500},
				{NodeID: "node-0007", TenantID: "tn", AfterID: 3, Limit: 500},
			} {
				q, args := eventsQuery(f, "", nil, "id")
				cases = append(cases, struct {
					name string
					q    string
					args []any
				}{fmt.Sprintf("events %+v", f), q, args})
				if engine == Postgres {
					q, args := eventsSinceQuery(f, "0", 0, nil)
					cases = append(cases, struct {
						name string
						q    string
						args []any
					}{fmt.Sprintf("events since %+v", f), q, args})
				}
			}
			// A node's newest events (read backwards), and its events of some kinds.
			q, args := eventsQuery(EventFilter{NodeID: "node-0007", Newest: true, Limit: 20}, ` AND id <= ?`, []any{int64(math.MaxInt64)}, "id DESC")
			cases = append(cases, struct {
				name string
				q    string
				args []any
			}{"newest events of a node", q, args})
			q, args = eventsQuery(EventFilter{NodeID: "node-0007", Kinds: []string{"node.*", "workflow.step"}, Limit: 20}, "", nil, "id")
			cases = append(cases, struct {
				name string
				q    string
				args []any
			}{"events of a node by kind", q, args})
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if plan := planOf(t, s, c.q, c.args...); !strings.Contains(plan, "events_node") {
						t.Errorf("plan %q: want a search of events_node", plan)
					}
				})
			}
			// And the listing still answers what it did.
			got, err := s.Events(ctx, EventFilter{NodeID: "node-0007", TenantID: "tn", Limit: 4})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 4 || got[0].NodeID != "node-0007" || got[0].ID >= got[3].ID {
				t.Errorf("events of node-0007: %+v", got)
			}
			if other, err := s.Events(ctx, EventFilter{NodeID: "node-0007", TenantID: "another", Limit: 4}); err != nil || len(other) != 0 {
				t.Errorf("events of node-0007 in another tenant: %v, %v", other, err)
			}
		})
	}
}

// A site agent's report looks up, for each machine it saw, the site's MAC-less nodes under the
// machine's UUID: through nodes_site_uuid, not by reading every node of the site.
func TestNodesWithoutMACsUsesTheUUIDIndex(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			const nodes = 2000
			uuid := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
			var site Site
			if err := s.Write(ctx, func(tx *Tx) error {
				tn, err := tx.InsertTenant(ctx, "t")
				if err != nil {
					return err
				}
				if site, err = tx.InsertSite(ctx, tn.ID, "s", nil); err != nil {
					return err
				}
				if err := tx.PutHardwareProfile(ctx, HardwareProfile{Name: "hp", Drivers: map[string]string{}}); err != nil {
					return err
				}
				pool, err := tx.InsertPool(ctx, Pool{TenantID: tn.ID, SiteID: site.ID, Name: "p", Policy: PoolPolicy{HardwareProfile: "hp"}})
				if err != nil {
					return err
				}
				for i := range nodes {
					n := Node{ID: fmt.Sprintf("node-%05d", i), TenantID: tn.ID, SiteID: site.ID, PoolID: pool.ID, Name: fmt.Sprintf("n%d", i),
						State: "ready", HardwareProfile: "hp", ProductUUID: uuid(i)}
					if i%500 != 7 {
						n.MACs = []string{fmt.Sprintf("52:54:00:00:%02x:%02x", i/256, i%256)}
					}
					if err := tx.InsertNode(ctx, &n); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.write.ExecContext(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
			if plan := planOf(t, s, nodesWithoutMACsQuery, site.ID, uuid(507), uuid(9999)); !strings.Contains(plan, "nodes_site_uuid") {
				t.Errorf("plan %q: want a search of nodes_site_uuid", plan)
			}
			for _, c := range []struct {
				a, b string
				want string
			}{
				{uuid(507), uuid(9999), "[node-00507]"},
				{uuid(9999), uuid(1007), "[node-01007]"},
				{uuid(508), uuid(9999), "[]"}, // it has a MAC
				{uuid(9999), "", "[]"},
			} {
				var got []string
				if err := s.Write(ctx, func(tx *Tx) error {
					var err error
					got, err = tx.NodesWithoutMACs(ctx, site.ID, c.a, c.b)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(got) != c.want {
					t.Errorf("nodes without MACs under %s or %s: %v, want %s", c.a, c.b, got, c.want)
				}
			}
		})
	}
}

// Every verified rotation looks for superseded versions whose secret is still stored: through
// bmc_credential_versions_unpurged, not by reading (and sorting) every version ever made.
func TestSupersededWithSecretsUsesItsIndex(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			const nodes, versions = 1000, 5
			if err := s.Write(ctx, func(tx *Tx) error {
				for n := range nodes {
					for v := 1; v <= versions; v++ {
						c := CredentialVersion{NodeID: fmt.Sprintf("node-%04d", n), Version: uint64(v), UsernameRef: "secret://u", State: CredSuperseded}
						switch {
						case v == versions:
							c.State, c.PasswordRef = CredCurrent, fmt.Sprintf("secret://p%d-%d", n, v)
						case v == versions-1 && n%100 == 0:
							c.PasswordRef = fmt.Sprintf("secret://p%d-%d", n, v) // not purged yet
						}
						if err := tx.InsertCredentialVersion(ctx, &c); err != nil {
							return err
						}
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.write.ExecContext(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
			plan := planOf(t, s, supersededWithSecretsQuery, CredSuperseded, 100)
			if !strings.Contains(plan, "bmc_credential_versions_unpurged") || strings.Contains(plan, "TEMP B-TREE") {
				t.Errorf("plan %q: want a search of bmc_credential_versions_unpurged in order", plan)
			}
			for _, limit := range []int{3, 100} {
				var got []CredentialVersion
				if err := s.Write(ctx, func(tx *Tx) error {
					var err error
					got, err = tx.SupersededWithSecrets(ctx, limit)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if want := min(limit, nodes/100); len(got) != want {
					t.Fatalf("limit %d: %d versions, want %d", limit, len(got), want)
				}
				for i, c := range got {
					if c.State != CredSuperseded || c.PasswordRef == "" || i > 0 && c.CreatedAt < got[i-1].CreatedAt {
						t.Errorf("limit %d: version %d: %+v", limit, i, c)
					}
				}
			}
		})
	}
}

// A DHCP lease report's removal of an address retaken by another MAC searches
// site_dhcp_leases_ip, not every lease of the site (n leases reported, n searches).
func TestDHCPAddressRetakenUsesItsIndex(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			const leases = 2000
			ls := make([]DHCPLease, leases)
			for i := range ls {
				ls[i] = DHCPLease{MAC: fmt.Sprintf("52:54:00:01:%02x:%02x", i/256, i%256), IP: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), Expires: time.Now().Add(time.Hour).UnixMicro()}
			}
			if err := s.Write(ctx, func(tx *Tx) error { return tx.PutDHCPLeases(ctx, "site-1", ls) }); err != nil {
				t.Fatal(err)
			}
			if _, err := s.write.ExecContext(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
			if plan := planOf(t, s, dhcpAddressRetakenQuery, "site-1", "10.1.3.7", "52:54:00:01:ff:ff"); !strings.Contains(plan, "site_dhcp_leases_ip") {
				t.Errorf("plan %q: want a search of site_dhcp_leases_ip", plan)
			}
			// The address moves to another MAC: its old lease goes, the others stay.
			moved := DHCPLease{MAC: "52:54:00:02:00:01", IP: ls[7].IP, Expires: ls[7].Expires}
			if err := s.Write(ctx, func(tx *Tx) error { return tx.PutDHCPLeases(ctx, "site-1", []DHCPLease{moved}) }); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := s.read.QueryRowContext(ctx, s.bind(`SELECT COUNT(*) FROM site_dhcp_leases WHERE site_id = ? AND ip = ?`), "site-1", ls[7].IP).Scan(&n); err != nil || n != 1 {
				t.Errorf("leases of %s after it moved: %d (%v), want 1", ls[7].IP, n, err)
			}
		})
	}
}

// Doctor's queues read the claim indexes (commands_claim_site, commands_claim_ramdisk: the
// queued commands alone), not every command ever sent.
func TestQueueDepthsUseTheClaimIndexes(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			if err := s.Write(ctx, func(tx *Tx) error {
				for i := range 5000 {
					c := Command{NodeID: fmt.Sprintf("node-%04d", i%500), SiteID: "site-a", Kind: "bmc.power", Args: "{}", RunsOn: "site", State: "succeeded"}
					if i%2 == 0 {
						c.RunsOn, c.Kind = "ramdisk", "disk.wipe"
					}
					if i%250 == 0 {
						c.State = "queued"
					}
					if err := tx.InsertCommand(ctx, &c); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.write.ExecContext(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
			for on, index := range map[string]string{"site": "commands_claim_site", "ramdisk": "commands_claim_ramdisk"} {
				if plan := planOf(t, s, queueDepthQuery(on)); !strings.Contains(plan, index) {
					t.Errorf("%s queue's plan %q: want it to read %s", on, plan, index)
				}
			}
			depths, err := s.QueueDepths(ctx)
			if err != nil || len(depths) != 1 || depths[0].SiteID != "site-a" || depths[0].RunsOn != "ramdisk" || depths[0].Commands != 20 {
				t.Errorf("queues %+v %v: want site-a's 20 ramdisk commands (every 250th command queued, all even)", depths, err)
			}
		})
	}
}
