package store

import (
	"maps"
	"slices"
	"strings"
)

// rowCache keeps, for SQLite's writer, the node rows and open workflows its transactions read,
// as they are in the database: a lifecycle's every step reads its node and its open workflow
// again (LockNode, OpenWorkflow), a tenth of the writer's time when each was a statement. Only
// the writer's goroutine uses it, and only the writer writes the database, so it can be kept
// exact:
//   - the writes of a node or workflow whose effect the store knows (UpdateNode, SetPower,
//     PinDeployImage, InsertWorkflow, UpdateWorkflow: rowStmts) apply it to the cached copy or
//     drop it;
//   - any other statement that names the nodes or workflows table empties that table's part
//     (classify, at the statement's preparation);
//   - a rollback, of the transaction or to a savepoint, empties it all (liteConn).
//
// Copies go in and out (the maps and slices of a row are cloned), so a caller changing what it
// read changes nothing here. Bounded: emptied when full.
type rowCache struct {
	nodes map[string]Node
	open  map[string]openWF // by node id
}

// openWF is a node's open workflow as OpenWorkflow reads it; ok false: it has none.
type openWF struct {
	w  Workflow
	ok bool
}

// maxCachedRows bounds each part of the cache (a machine in a workflow is about 4 KiB).
const maxCachedRows = 1 << 14

func newRowCache() *rowCache {
	return &rowCache{nodes: map[string]Node{}, open: map[string]openWF{}}
}

// touch is what a statement may change of what rowCache holds.
type touch uint8

const (
	touchNodes touch = 1 << iota
	touchWorkflows
	touchAll = touchNodes | touchWorkflows
)

// Statements whose effect on the cache their functions apply (rowStmts).
const (
	updateNodeStmt = `UPDATE nodes SET state = ?, target_state = ?, chain_verb = ?, failed_from = ?, fault_code = ?,
		fault_message = ?, maintenance = ?, maintenance_reason = ?, power = ?, deploy_profile = ?, deploy_image = ?,
		wipe_mode = ?, batch_id = ?, identity_generation = ?, verb_from = ?, verb_by = ?, conditions = ?, bmc_username_ref = ?, bmc_password_ref = ?,
		linger_until = ?, linger_command = ?, boot_mode = ?, version = version + 1, updated_at = ?
		WHERE id = ? AND version = ?`
	setPowerStmt       = `UPDATE nodes SET power = ? WHERE id = ?`
	pinDeployImageStmt = `UPDATE nodes SET deploy_image_digest = ? WHERE id = ?` // (no column of Node)
	insertWorkflowStmt = `INSERT INTO workflows (` + workflowCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	updateWorkflowStmt = `UPDATE workflows SET state = ?, phase = ?, step_index = ?, step_attempt = ?, step_started_at = ?,
		step_deadline = ?, current_command = ?, boot_epoch = ?, abort_requested = ?, fault_code = ?, error = ?, outcome_applied = ?,
		updated_at = ?, finished_at = ? WHERE id = ?`
)

// rowStmts are the statements classify leaves to their functions.
var rowStmts = map[string]bool{updateNodeStmt: true, setPowerStmt: true, pinDeployImageStmt: true, insertWorkflowStmt: true, updateWorkflowStmt: true}

// classify says what statement q may change of the cache: a rollback everything, another
// statement that names the nodes or workflows table (a write: reads name them too, and change
// nothing) that table's rows. Over-approximate by design: a statement that merely mentions a
// table empties its part.
func classify(q string) touch {
	if rowStmts[q] {
		return 0
	}
	s := strings.TrimSpace(q)
	head := strings.ToUpper(s[:min(len(s), 9)])
	for _, p := range []string{"SELECT", "BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "PRAGMA"} {
		if strings.HasPrefix(head, p) {
			return 0
		}
	}
	if strings.HasPrefix(head, "ROLLBACK") {
		return touchAll
	}
	lower := strings.ToLower(s)
	var t touch
	if strings.Contains(lower, "nodes") {
		t |= touchNodes
	}
	if strings.Contains(lower, "workflows") {
		t |= touchWorkflows
	}
	return t
}

// forget empties what t says may have changed.
func (c *rowCache) forget(t touch) {
	if t&touchNodes != 0 && len(c.nodes) > 0 {
		clear(c.nodes)
	}
	if t&touchWorkflows != 0 && len(c.open) > 0 {
		clear(c.open)
	}
}

func (c *rowCache) node(id string) (Node, bool) {
	n, ok := c.nodes[id]
	if !ok {
		return Node{}, false
	}
	return cloneNode(n), true
}

func (c *rowCache) putNode(n Node) {
	if len(c.nodes) >= maxCachedRows {
		clear(c.nodes)
	}
	c.nodes[n.ID] = cloneNode(n)
}

// updatedNode applies UpdateNode's columns of n, just written, to the cached row.
func (c *rowCache) updatedNode(n *Node) {
	m, ok := c.nodes[n.ID]
	if !ok {
		return
	}
	m.State, m.TargetState, m.ChainVerb, m.FailedFrom, m.FaultCode, m.FaultMsg = n.State, n.TargetState, n.ChainVerb, n.FailedFrom, n.FaultCode, n.FaultMsg
	m.Maintenance, m.MaintenanceReason, m.Power, m.DeployProfile, m.DeployImage = n.Maintenance, n.MaintenanceReason, n.Power, n.DeployProfile, n.DeployImage
	m.WipeMode, m.BatchID, m.IdentityGeneration, m.VerbFrom, m.VerbBy = n.WipeMode, n.BatchID, n.IdentityGeneration, n.VerbFrom, n.VerbBy
	m.Conditions = cloneStringMap(n.Conditions)
	m.BMCUsernameRef, m.BMCPasswordRef, m.LingerUntil, m.LingerCommand, m.BootMode = n.BMCUsernameRef, n.BMCPasswordRef, n.LingerUntil, n.LingerCommand, n.BootMode
	m.Version, m.UpdatedAt = n.Version, n.UpdatedAt
	c.nodes[n.ID] = m
}

func (c *rowCache) setPower(id, power string) {
	if m, ok := c.nodes[id]; ok {
		m.Power = power
		c.nodes[id] = m
	}
}

func (c *rowCache) dropNode(id string) { delete(c.nodes, id) }

func (c *rowCache) openWorkflow(nodeID string) (Workflow, bool, bool) {
	e, ok := c.open[nodeID]
	if !ok {
		return Workflow{}, false, false
	}
	e.w.CommandKinds = slices.Clone(e.w.CommandKinds)
	return e.w, e.ok, true
}

func (c *rowCache) putOpen(nodeID string, w Workflow, ok bool) {
	if len(c.open) >= maxCachedRows {
		clear(c.open)
	}
	w.CommandKinds = slices.Clone(w.CommandKinds)
	c.open[nodeID] = openWF{w: w, ok: ok}
}

// updatedWorkflow applies UpdateWorkflow's columns of w, just written, to the node's cached
// open workflow if it is w and stays open; otherwise the node's entry is dropped (w closed, so
// an older one may be open; or w is another workflow).
func (c *rowCache) updatedWorkflow(w *Workflow) {
	e, ok := c.open[w.NodeID]
	if !ok {
		return
	}
	if !e.ok || e.w.ID != w.ID || w.OutcomeApplied {
		delete(c.open, w.NodeID)
		return
	}
	m := &e.w
	m.State, m.Phase, m.StepIndex, m.StepAttempt, m.StepStartedAt = w.State, w.Phase, w.StepIndex, w.StepAttempt, w.StepStartedAt
	m.StepDeadline, m.CurrentCommand, m.BootEpoch, m.AbortRequested, m.FaultCode, m.Error = w.StepDeadline, w.CurrentCommand, w.BootEpoch, w.AbortRequested, w.FaultCode, w.Error
	m.OutcomeApplied, m.UpdatedAt, m.FinishedAt = w.OutcomeApplied, w.UpdatedAt, w.FinishedAt
	c.open[w.NodeID] = e
}

func (c *rowCache) dropOpen(nodeID string) { delete(c.open, nodeID) }

func cloneNode(n Node) Node {
	n.Drivers, n.Labels, n.Conditions = maps.Clone(n.Drivers), maps.Clone(n.Labels), maps.Clone(n.Conditions)
	n.MACs = slices.Clone(n.MACs)
	return n
}

// cloneStringMap is m as written (labelsJSON) and read back: a nil map reads back empty.
func cloneStringMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}
