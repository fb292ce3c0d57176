package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

const nodeCols = `id, tenant_id, site_id, pool_id, name, state, target_state, chain_verb, failed_from, fault_code,
	fault_message, maintenance, maintenance_reason, power, hardware_profile, drivers, bmc_driver, bmc_address,
	bmc_username_ref, bmc_password_ref, bmc_insecure, bmc_fingerprint, product_uuid, labels, macs,
	deploy_profile, deploy_image, wipe_mode, batch_id, identity_generation, version, created_at, updated_at, verb_from, verb_by, conditions,
	linger_until, linger_command, boot_mode, user_data_ref, user_data_sha256, user_data_size`

func scanNode(r interface{ Scan(...any) error }) (Node, error) {
	if sc := takeScratch(r); sc != nil {
		defer sc.release()
		if err := scanNodeInto(r, &sc.node, &sc.nodeCols, sc.dst[:0]); err != nil {
			return Node{}, err
		}
		return sc.node, nil // (copied out before the release)
	}
	var n Node
	var x nodeTextCols
	if err := scanNodeInto(r, &n, &x, nil); err != nil {
		return Node{}, err
	}
	return n, nil
}

// nodeTextCols are the columns of a node's row that are decoded after the scan.
type nodeTextCols struct {
	drivers, labels, macs, conds string
	gen, ver                     int64
}

// scanNodeInto scans a node's row into n, with x and dst (reused: appended to from empty) for
// the scan's own use.
func scanNodeInto(r rowScanner, n *Node, x *nodeTextCols, dst []any, extra ...any) error {
	dst = append(dst, &n.ID, &n.TenantID, &n.SiteID, &n.PoolID, &n.Name, &n.State, &n.TargetState, &n.ChainVerb,
		&n.FailedFrom, &n.FaultCode, &n.FaultMsg, &n.Maintenance, &n.MaintenanceReason, &n.Power, &n.HardwareProfile,
		&x.drivers, &n.BMCDriver, &n.BMCAddress, &n.BMCUsernameRef, &n.BMCPasswordRef, &n.BMCInsecure, &n.BMCFingerprint,
		&n.ProductUUID, &x.labels, &x.macs, &n.DeployProfile, &n.DeployImage, &n.WipeMode, &n.BatchID, &x.gen, &x.ver,
		&n.CreatedAt, &n.UpdatedAt, &n.VerbFrom, &n.VerbBy, &x.conds, &n.LingerUntil, &n.LingerCommand, &n.BootMode,
		&n.UserDataRef, &n.UserDataSHA256, &n.UserDataSize)
	if err := r.Scan(append(dst, extra...)...); err != nil {
		return err
	}
	return decodeNodeCols(n, *x)
}

// decodeNodeCols sets n's maps, MACs, identity generation and version from x, its row's
// columns of them.
func decodeNodeCols(n *Node, x nodeTextCols) error {
	if err := decodeStringMap(x.conds, &n.Conditions); err != nil {
		return fmt.Errorf("decoding conditions of node %s: %w", n.ID, err)
	}
	n.IdentityGeneration, n.Version = uint64(x.gen), uint64(x.ver)
	if err := decodeStringMap(x.drivers, &n.Drivers); err != nil {
		return fmt.Errorf("decoding drivers of node %s: %w", n.ID, err)
	}
	if err := decodeStringMap(x.labels, &n.Labels); err != nil {
		return fmt.Errorf("decoding labels of node %s: %w", n.ID, err)
	}
	if err := decodeStringSlice(x.macs, &n.MACs); err != nil {
		return fmt.Errorf("decoding MACs of node %s: %w", n.ID, err)
	}
	return nil
}

// InsertNode creates a node with its MACs and labels. A MAC that belongs to another node or a
// name taken in the tenant is a conflict.
func (t *Tx) InsertNode(ctx context.Context, n *Node) error {
	n.CreatedAt, n.UpdatedAt, n.Version = t.at, t.at, 1
	if n.IdentityGeneration == 0 {
		n.IdentityGeneration = 1
	}
	if n.MACs == nil {
		n.MACs = []string{}
	}
	x := nodeTextCols{drivers: labelsJSON(n.Drivers), labels: labelsJSON(n.Labels), macs: mustJSON(n.MACs), conds: labelsJSON(n.Conditions)}
	res, err := t.exec(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		n.ID, n.TenantID, n.SiteID, n.PoolID, n.Name, n.State, n.TargetState, n.ChainVerb, n.FailedFrom, n.FaultCode,
		n.FaultMsg, n.Maintenance, n.MaintenanceReason, n.Power, n.HardwareProfile, x.drivers, n.BMCDriver, n.BMCAddress,
		n.BMCUsernameRef, n.BMCPasswordRef, n.BMCInsecure, n.BMCFingerprint, n.ProductUUID, x.labels, x.macs,
		n.DeployProfile, n.DeployImage, n.WipeMode, n.BatchID, int64(n.IdentityGeneration), int64(n.Version), n.CreatedAt, n.UpdatedAt,
		n.VerbFrom, n.VerbBy, x.conds, n.LingerUntil, n.LingerCommand, n.BootMode,
		n.UserDataRef, n.UserDataSHA256, n.UserDataSize)
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("a node named %q already exists in this tenant: %w", n.Name, ErrConflict)
		}
		return fmt.Errorf("inserting node %q: %w", n.Name, err)
	}
	if rc := t.rows(); rc != nil {
		row, _ := res.LastInsertId()
		rc.putNode(*n, x, row)
	}
	for _, mac := range n.MACs {
		if _, err := t.exec(ctx, `INSERT INTO node_macs (mac, node_id) VALUES (?, ?)`, mac, n.ID); err != nil {
			if isUnique(err) {
				return fmt.Errorf("MAC %s already belongs to another node: %w", mac, ErrConflict)
			}
			return fmt.Errorf("inserting MAC %s: %w", mac, err)
		}
	}
	for k, v := range n.Labels {
		if _, err := t.exec(ctx, `INSERT INTO node_labels (node_id, key, value) VALUES (?, ?, ?)`, n.ID, k, v); err != nil {
			return fmt.Errorf("inserting label %s: %w", k, err)
		}
	}
	return nil
}

// LockNode reads a node by id or name for update (row-locked on PostgreSQL). tenantID, when not
// empty, restricts the lookup to that tenant.
func (t *Tx) LockNode(ctx context.Context, ref, tenantID string) (Node, error) {
	if rc := t.rows(); rc != nil {
		n, found, err := t.writerNode(ctx, rc, ref, tenantID)
		if err != nil {
			return Node{}, err
		}
		if found {
			t.readNode(n)
			return n, nil
		}
		// (Not an id of the tenant: a name, or nothing.)
	}
	n, err := t.s.resolveNode(ctx, ref, tenantID, func(q string, args ...any) rowScanner {
		return t.queryRow(ctx, q+t.forUpdate(), args...)
	}, func(q string, args ...any) (rowsIter, error) { return t.query(ctx, q, args...) })
	if err == nil && t.lc != nil {
		t.readNode(n)
	}
	return n, err
}

// nodeRowQuery reads a node of a tenant ("" any) by id, with its rowid (SQLite's writer).
const nodeRowQuery = `SELECT ` + nodeCols + `, rowid FROM nodes WHERE id = ? AND (? = '' OR tenant_id = ?)`

// writerNode reads node id of tenant tenantID ("" any) in SQLite's writer: from its cache, else
// its row, which the cache then holds. found false: no node has that id in the tenant.
func (t *Tx) writerNode(ctx context.Context, rc *workflowCache, id, tenantID string) (Node, bool, error) {
	if n, ok := rc.node(id); ok && (tenantID == "" || n.TenantID == tenantID) {
		return n, true, nil
	}
	return t.writerNodeRow(ctx, rc, id, tenantID)
}

// writerNodeRow is writerNode's read of the row (apart: the node it scans into moves to the
// heap, which a read from the cache need not).
func (t *Tx) writerNodeRow(ctx context.Context, rc *workflowCache, id, tenantID string) (n Node, found bool, err error) {
	var x nodeTextCols
	var row int64
	err = scanNodeInto(t.queryRow(ctx, nodeRowQuery, id, tenantID, tenantID), &n, &x, nil, &row)
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, false, nil
	}
	if err != nil {
		return Node{}, false, fmt.Errorf("reading node %q: %w", id, err)
	}
	rc.putNode(n, x, row)
	return n, true, nil
}

// nodeKeys are a node's indexed columns that UpdateNode sets, as its row holds them at a
// version: nodes_state and nodes_batch.
type nodeKeys struct {
	version      uint64
	state, batch string
}

// readNode records what the transaction read of n's indexed columns (SQLite's writer).
func (t *Tx) readNode(n Node) {
	if t.nodes == nil {
		t.nodes = map[string]nodeKeys{}
	}
	t.nodes[n.ID] = nodeKeys{version: n.Version, state: n.State, batch: n.BatchID}
}

// LockedNode is a node as a reconciliation that follows in the transaction takes it: its row,
// locked, its wake sequence (as WakeUpSeq reads it) and its open workflow (as OpenWorkflow
// reads it; Open false: none).
type LockedNode struct {
	Node
	Seq      int64
	Workflow Workflow
	Open     bool
}

// LockNodeForReconcile locks and reads node id (an id, not a name), its wake sequence and its
// open workflow: on PostgreSQL the two reads go out in one round trip, after what is held.
func (t *Tx) LockNodeForReconcile(ctx context.Context, id string) (LockedNode, error) {
	ln, _, err := t.lockNodeForReconcile(ctx, id, nil, Command{})
	return ln, err
}

// LockNodeForReconcileAndUpdateCommand is LockNodeForReconcile followed by UpdateCommandIf(c,
// was), on PostgreSQL in the same round trip: the node's lock is taken before the command's
// row, as every transaction that takes both takes them. updated says whether the command's row
// was as was and is now c; a node that does not exist (ErrNotFound) leaves the update made.
func (t *Tx) LockNodeForReconcileAndUpdateCommand(ctx context.Context, id string, c *Command, was Command) (ln LockedNode, updated bool, err error) {
	return t.lockNodeForReconcile(ctx, id, c, was)
}

func (t *Tx) lockNodeForReconcile(ctx context.Context, id string, c *Command, was Command) (LockedNode, bool, error) {
	var ln LockedNode
	found, updated := true, false
	var err error
	if t.conn != nil {
		nodeQ := t.s.bind(`SELECT ` + nodeCols + `, COALESCE((SELECT q.seq FROM reconcile_queue q WHERE q.node_id = nodes.id), 0)
		FROM nodes WHERE id = ?` + t.forUpdate())
		// A node not found is no error of the pipeline: the reads after it are still taken.
		takeNode := func(r rowScanner) error {
			var err error
			ln.Node, err = scanNode(withExtra{r, []any{&ln.Seq}})
			if errors.Is(err, sql.ErrNoRows) {
				found = false
				return nil
			}
			if err != nil {
				return fmt.Errorf("reading node %q: %w", id, err)
			}
			return nil
		}
		takeWorkflow := func(r rowScanner) error {
			var err error
			ln.Workflow, ln.Open, err = scanOpenWorkflow(r, id)
			return err
		}
		// Each result is read before the next (pgx reads a batch's results in order).
		reads := []*batchRead{
			{q: nodeQ, args: []any{id}, take: func(br pgx.BatchResults) error { return takeNode(br.QueryRow()) }},
			{q: t.s.bind(openWorkflowQuery), args: []any{id, false}, take: func(br pgx.BatchResults) error { return takeWorkflow(br.QueryRow()) }},
		}
		if c != nil {
			q, args := updateCommandIf(c, was, t.at)
			reads = append(reads, &batchRead{q: t.s.bind(q), args: args, take: func(br pgx.BatchResults) error {
				tag, err := br.Exec()
				if err != nil {
					return fmt.Errorf("updating command %s: %w", c.ID, err)
				}
				updated = tag.RowsAffected() == 1
				return nil
			}})
		}
		_, err = t.send(ctx, reads...)
		if err == nil && updated {
			c.UpdatedAt = t.at
		}
	} else {
		// SQLite's writer: the node as LockNode reads it (from the cache first), its wake
		// sequence as WakeUpSeq does, and its open workflow as OpenWorkflow does.
		if ln.Node, found, err = t.writerNode(ctx, t.rows(), id, ""); err == nil && found {
			t.readNode(ln.Node)
			ln.Seq, err = t.WakeUpSeq(ctx, id)
		}
		if err == nil {
			ln.Workflow, ln.Open, err = t.OpenWorkflow(ctx, id)
		}
		if err == nil && c != nil {
			updated, err = t.UpdateCommandIf(ctx, c, was)
		}
	}
	if err != nil {
		return LockedNode{}, false, err
	}
	if !found {
		return LockedNode{}, updated, fmt.Errorf("node %q: %w", id, ErrNotFound)
	}
	return ln, updated, nil
}

// withExtra scans a row's columns past what its scanner takes into extra.
type withExtra struct {
	r     rowScanner
	extra []any
}

func (w withExtra) Scan(dest ...any) error { return w.r.Scan(append(dest, w.extra...)...) }

func (w withExtra) scratch() *scanScratch { return scratchOf(w.r) }

// Node reads a node by id or name.
func (s *Store) Node(ctx context.Context, ref, tenantID string) (Node, error) {
	return s.resolveNode(ctx, ref, tenantID, func(q string, args ...any) rowScanner {
		return s.queryRow(ctx, q, args...)
	}, func(q string, args ...any) (rowsIter, error) { return s.queryRows(ctx, q, args...) })
}

// NodeGeneration reads node id's identity generation (ErrNotFound: no node has that id; names
// are not looked at). The gateway admits a node's certificate by it at every stream and every
// re-check of an open one: one column, not the node's row with its maps.
func (s *Store) NodeGeneration(ctx context.Context, id string) (uint64, error) {
	var gen int64
	err := s.queryRow(ctx, `SELECT identity_generation FROM nodes WHERE id = ?`, id).Scan(&gen)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("reading the identity generation of node %s: %w", id, err)
	}
	return uint64(gen), nil
}

// ErrAmbiguous is a node name that exists in several tenants of an all-tenant caller.
var ErrAmbiguous = errors.New("ambiguous")

func (s *Store) resolveNode(ctx context.Context, ref, tenantID string, row func(string, ...any) rowScanner, rows func(string, ...any) (rowsIter, error)) (Node, error) {
	n, err := scanNode(row(`SELECT `+nodeCols+` FROM nodes WHERE id = ? AND (? = '' OR tenant_id = ?)`, ref, tenantID, tenantID))
	if err == nil {
		return n, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("reading node %q: %w", ref, err)
	}
	// By name: find the id first (names are unique per tenant only).
	rs, err := rows(`SELECT id FROM nodes WHERE name = ? AND (? = '' OR tenant_id = ?) LIMIT 2`, ref, tenantID, tenantID)
	if err != nil {
		return Node{}, fmt.Errorf("looking up node %q: %w", ref, err)
	}
	var ids []string
	for rs.Next() {
		var id string
		if err := rs.Scan(&id); err != nil {
			rs.Close()
			return Node{}, fmt.Errorf("looking up node %q: %w", ref, err)
		}
		ids = append(ids, id)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return Node{}, fmt.Errorf("looking up node %q: %w", ref, err)
	}
	switch len(ids) {
	case 0:
		return Node{}, fmt.Errorf("node %q: %w", ref, ErrNotFound)
	case 2:
		return Node{}, fmt.Errorf("node name %q exists in several tenants, use its id: %w", ref, ErrAmbiguous)
	}
	n, err = scanNode(row(`SELECT `+nodeCols+` FROM nodes WHERE id = ?`, ids[0]))
	if err != nil {
		return Node{}, fmt.Errorf("reading node %q: %w", ref, err)
	}
	return n, nil
}

// UpdateNode writes the mutable fields of n if the stored version is still n.Version, and bumps
// the version. The caller read n in the same transaction.
func (t *Tx) UpdateNode(ctx context.Context, n *Node) error {
	q := nodeUpdate
	conds := labelsJSON(n.Conditions)
	// (Values, not pointers to n's fields (Tx.args): the engine's run holds the node it updates,
	// and pointers to its fields would move every run to the heap.)
	args := make([]any, 0, 26)
	args = append(args, n.TargetState, n.ChainVerb, n.FailedFrom, n.FaultCode, n.FaultMsg, n.Maintenance, n.MaintenanceReason,
		n.Power, n.DeployProfile, n.DeployImage, n.WipeMode, int64(n.IdentityGeneration), n.VerbFrom, n.VerbBy, conds,
		n.BMCUsernameRef, n.BMCPasswordRef, n.LingerUntil, n.LingerCommand, n.BootMode, t.at)
	// The state and batch are set unless the transaction read them at this version (every
	// statement that sets either bumps the version) and they are kept: SQLite rewrites the
	// entries of every index over a column an UPDATE sets, changed or not (nodes_state,
	// nodes_batch). A run changes the state four times a phase, the batch once.
	k, known := t.nodes[n.ID]
	known = known && k.version == n.Version
	setState, setBatch := !known || k.state != n.State, !known || k.batch != n.BatchID
	qRow := nodeUpdateRow
	switch {
	case setState && setBatch:
		q, qRow, args = nodeUpdateWithState, nodeUpdateWithStateRow, append(args, n.State, n.BatchID)
	case setState:
		q, qRow, args = nodeUpdateState, nodeUpdateStateRow, append(args, n.State)
	case setBatch:
		q, qRow, args = nodeUpdateBatch, nodeUpdateBatchRow, append(args, n.BatchID)
	}
	// The writer's cache takes the row it holds out, and puts back what the statement leaves.
	rc := t.rows()
	was, _ := rc.takeNode(n.ID)
	var row int64
	if was != nil {
		row = was.row
	}
	res, err := t.updateByRow(ctx, q, qRow, row, args, n.ID, int64(n.Version))
	if err != nil {
		return fmt.Errorf("updating node %s: %w", n.ID, err)
	}
	if c, _ := res.RowsAffected(); c == 0 {
		rc.keepNode(n.ID, was)
		return fmt.Errorf("node %s at version %d: %w", n.ID, n.Version, ErrStale)
	}
	if was != nil {
		rc.keepNode(n.ID, was.repack(n.ID, func(w Node, x nodeTextCols) (Node, nodeTextCols) {
			return nodeUpdated(w, x, n, conds, setState, setBatch, t.at)
		}))
	}
	n.Version++
	n.UpdatedAt = t.at
	if t.lc != nil {
		t.readNode(*n)
	}
	return nil
}

// nodeUpdateSet is what UpdateNode sets besides the node's state and batch; nodeUpdate and
// nodeUpdateWithState are its statements without and with them, nodeUpdateState and
// nodeUpdateBatch with one of them; each ...Row the same by the row's rowid (updateByRow).
const (
	nodeUpdateSet = `target_state = ?, chain_verb = ?, failed_from = ?, fault_code = ?,
	fault_message = ?, maintenance = ?, maintenance_reason = ?, power = ?, deploy_profile = ?, deploy_image = ?,
	wipe_mode = ?, identity_generation = ?, verb_from = ?, verb_by = ?, conditions = ?, bmc_username_ref = ?, bmc_password_ref = ?,
	linger_until = ?, linger_command = ?, boot_mode = ?, version = version + 1, updated_at = ?`
	nodeUpdate             = `UPDATE nodes SET ` + nodeUpdateSet + ` WHERE id = ? AND version = ?`
	nodeUpdateWithState    = `UPDATE nodes SET ` + nodeUpdateSet + `, state = ?, batch_id = ? WHERE id = ? AND version = ?`
	nodeUpdateState        = `UPDATE nodes SET ` + nodeUpdateSet + `, state = ? WHERE id = ? AND version = ?`
	nodeUpdateBatch        = `UPDATE nodes SET ` + nodeUpdateSet + `, batch_id = ? WHERE id = ? AND version = ?`
	nodeUpdateRow          = `UPDATE nodes SET ` + nodeUpdateSet + ` WHERE rowid = ? AND id = ? AND version = ?`
	nodeUpdateWithStateRow = `UPDATE nodes SET ` + nodeUpdateSet + `, state = ?, batch_id = ? WHERE rowid = ? AND id = ? AND version = ?`
	nodeUpdateStateRow     = `UPDATE nodes SET ` + nodeUpdateSet + `, state = ? WHERE rowid = ? AND id = ? AND version = ?`
	nodeUpdateBatchRow     = `UPDATE nodes SET ` + nodeUpdateSet + `, batch_id = ? WHERE rowid = ? AND id = ? AND version = ?`
)

// DeleteNode removes a node (its MACs and labels cascade) and its wake-up row; its events stay.
// Its held and queued commands fail and its open workflows close with it; it is refused
// (ErrConflict) while an agent runs one of its commands.
func (t *Tx) DeleteNode(ctx context.Context, n Node) error {
	// What an agent is running for the node ends with its report; what no agent took yet would
	// otherwise stay queued for ever (and a BMC command's credentials, deleted below, could
	// never be opened for an agent again).
	var running int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM commands WHERE node_id = ? AND state IN ('delivered', 'running')`, n.ID).Scan(&running); err != nil {
		return fmt.Errorf("counting the commands in flight for node %s: %w", n.ID, err)
	}
	if running > 0 {
		return fmt.Errorf("node %s has %d commands an agent is running: delete it once they finish: %w", n.Name, running, ErrConflict)
	}
	if _, err := t.exec(ctx, `UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ? WHERE node_id = ? AND state IN ('held', 'queued')`,
		"the node was deleted", t.at, t.at, n.ID); err != nil {
		return fmt.Errorf("withdrawing the commands of node %s: %w", n.ID, err)
	}
	if _, err := t.exec(ctx, `UPDATE workflows SET state = 'aborted', error = ?, outcome_applied = ?, updated_at = ?, finished_at = ? WHERE node_id = ? AND NOT outcome_applied`,
		"the node was deleted", true, t.at, t.at, n.ID); err != nil {
		return fmt.Errorf("closing the workflows of node %s: %w", n.ID, err)
	}
	res, err := t.exec(ctx, `DELETE FROM nodes WHERE id = ? AND version = ?`, n.ID, int64(n.Version))
	if err != nil {
		return fmt.Errorf("deleting node %s: %w", n.ID, err)
	}
	if c, _ := res.RowsAffected(); c == 0 {
		return fmt.Errorf("node %s at version %d: %w", n.ID, n.Version, ErrStale)
	}
	if _, err := t.exec(ctx, `DELETE FROM reconcile_queue WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("deleting wake-up of node %s: %w", n.ID, err)
	}
	if _, err := t.exec(ctx, `DELETE FROM mac_candidates WHERE node_id = ?`, n.ID); err != nil {
		return fmt.Errorf("deleting MAC candidate of node %s: %w", n.ID, err)
	}
	// A machine an acceptance enrolled as this node is undecided again: seen again, it can be
	// accepted (or rejected) anew, not held for ever by a node that is gone.
	if _, err := t.exec(ctx, `UPDATE discovered SET acceptance = ?, node_id = '', decided_by = '' WHERE node_id = ?`, AcceptancePending, n.ID); err != nil {
		return fmt.Errorf("releasing the discovered machine of node %s: %w", n.ID, err)
	}
	for _, ref := range []string{n.BMCUsernameRef, n.BMCPasswordRef, n.UserDataRef} {
		if id, ok := strings.CutPrefix(ref, "secret://"); ok {
			if err := t.DeleteSecret(ctx, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// UserData is what a node row keeps of the operator user-data of its deploy: the sealed value's
// secret:// reference, its size and hex SHA-256. The zero value is none.
type UserData struct {
	Ref, SHA256 string
	Size        int64
}

// SetNodeUserData replaces n's user-data columns with u (the zero value clears them), bumping
// the version, and deletes the secret the old reference named (one reference per secret: the
// deploy verb seals each user-data anew). n was read in the same transaction; it is updated.
func (t *Tx) SetNodeUserData(ctx context.Context, n *Node, u UserData) error {
	res, err := t.exec(ctx, `UPDATE nodes SET user_data_ref = ?, user_data_sha256 = ?, user_data_size = ?, version = version + 1, updated_at = ?
		WHERE id = ? AND version = ?`, u.Ref, u.SHA256, u.Size, t.at, n.ID, int64(n.Version))
	if err != nil {
		return fmt.Errorf("setting the user-data of node %s: %w", n.ID, err)
	}
	if c, _ := res.RowsAffected(); c == 0 {
		return fmt.Errorf("node %s at version %d: %w", n.ID, n.Version, ErrStale)
	}
	if id, ok := strings.CutPrefix(n.UserDataRef, "secret://"); ok && n.UserDataRef != u.Ref {
		if err := t.DeleteSecret(ctx, id); err != nil {
			return fmt.Errorf("deleting the replaced user-data of node %s: %w", n.ID, err)
		}
	}
	n.UserDataRef, n.UserDataSHA256, n.UserDataSize = u.Ref, u.SHA256, u.Size
	n.Version++
	n.UpdatedAt = t.at
	return nil
}

// SiteUserData returns, by node, the user-data of the site's nodes that have some (a boot
// lease's push of instance entries).
func (t *Tx) SiteUserData(ctx context.Context, siteID string) (map[string]UserData, error) {
	rows, err := t.query(ctx, `SELECT id, user_data_ref, user_data_sha256, user_data_size FROM nodes WHERE site_id = ? AND user_data_ref <> ''`, siteID)
	if err != nil {
		return nil, fmt.Errorf("reading the user-data of site %s: %w", siteID, err)
	}
	defer rows.Close()
	out := map[string]UserData{}
	for rows.Next() {
		var id string
		var u UserData
		if err := rows.Scan(&id, &u.Ref, &u.SHA256, &u.Size); err != nil {
			return nil, fmt.Errorf("reading the user-data of site %s: %w", siteID, err)
		}
		out[id] = u
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the user-data of site %s: %w", siteID, err)
	}
	return out, nil
}

// NodeFilter selects nodes; empty fields match everything.
type NodeFilter struct {
	TenantID, State, PoolID, SiteID string
	Maintenance                     *bool
	Labels                          [][2]string
	AfterID                         string
	Limit                           int
}

// Nodes lists nodes in id (creation) order after f.AfterID, at most f.Limit.
func (s *Store) Nodes(ctx context.Context, f NodeFilter) ([]Node, error) {
	var where []string
	var args []any
	add := func(cond string, a ...any) {
		where = append(where, cond)
		args = append(args, a...)
	}
	add("id > ?", f.AfterID)
	if f.TenantID != "" {
		add("tenant_id = ?", f.TenantID)
	}
	if f.State != "" {
		add("state = ?", f.State)
	}
	if f.PoolID != "" {
		add("pool_id = ?", f.PoolID)
	}
	if f.SiteID != "" {
		add("site_id = ?", f.SiteID)
	}
	if f.Maintenance != nil {
		add("maintenance = ?", *f.Maintenance)
	}
	for _, kv := range f.Labels {
		add("id IN (SELECT node_id FROM node_labels WHERE key = ? AND value = ?)", kv[0], kv[1])
	}
	args = append(args, f.Limit)
	rows, err := s.queryRows(ctx, `SELECT `+nodeCols+` FROM nodes WHERE `+strings.Join(where, " AND ")+` ORDER BY id LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	defer rows.Close()
	out := make([]Node, 0, min(f.Limit, 1024))
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("reading node: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// CountByState counts nodes per state (metrics, doctor).
func (s *Store) CountByState(ctx context.Context) (map[string]int, error) {
	return s.countBy(ctx, `SELECT state, COUNT(*) FROM nodes GROUP BY state`, "nodes per state")
}

// CountByStateOfTenant is CountByState of one tenant's nodes.
func (s *Store) CountByStateOfTenant(ctx context.Context, tenantID string) (map[string]int, error) {
	return s.countBy(ctx, `SELECT state, COUNT(*) FROM nodes WHERE tenant_id = ? GROUP BY state`, "the tenant's nodes per state", tenantID)
}

// countBy runs q, which selects (key, count) rows, into a map; what names them in errors.
func (s *Store) countBy(ctx context.Context, q, what string, args ...any) (map[string]int, error) {
	rows, err := s.queryRows(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("counting %s: %w", what, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, fmt.Errorf("reading the count of %s: %w", what, err)
		}
		out[k] = n
	}
	return out, rows.Err()
}
