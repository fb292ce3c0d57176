package store

import (
	"strings"
	"unsafe"
)

// cachedNode is a node's row as the SQLite writer read or last changed it, at rowid row, held
// so that the collector has little to do with it: its text columns one after another in text
// (the JSON of its maps and MACs as stored; each column ends at ends[i]), its numbers in nums,
// its flags in flags: one object without pointers besides the entry. A node read from it gets
// strings of its own (see fields), and decodes its maps and MACs from their JSON, as a read of
// the row does, so each read has maps of its own.
//
// (Measured at 10 000 nodes: a node held as its Node value, maps decoded, added about 60 MiB of
// resident memory. Its text columns as strings of their own, shared with the nodes read from
// it, made the collector's work per phase up to nearly twice as long (10 000 entries of 34 pointers,
// and the strings they hold). Its text columns handed out as slices of one string kept the
// whole row alive with any of them (an id kept by a command, an event, a workflow): peak RSS 35
// to 90 MiB higher.)
type cachedNode struct {
	text  string
	ends  [nodeTextCount]uint32
	nums  [nodeNumCount]int64
	flags uint8
	row   int64
}

func (e *cachedNode) rowid() int64 { return e.row }

const (
	nodeTextCount = 34
	nodeNumCount  = 6
)

// A cached node's flags.
const (
	flagMaintenance = 1 << iota
	flagBMCInsecure
)

// nodeTexts are pointers to n's text columns, and to x's JSON ones (drivers, labels, MACs,
// conditions), in the order the cache packs them; the id first.
func nodeTexts(n *Node, x *nodeTextCols) [nodeTextCount]*string {
	return [nodeTextCount]*string{&n.ID, &n.TenantID, &n.SiteID, &n.PoolID, &n.Name, &n.State, &n.TargetState, &n.ChainVerb,
		&n.FailedFrom, &n.FaultCode, &n.FaultMsg, &n.MaintenanceReason, &n.Power, &n.HardwareProfile, &n.BMCDriver,
		&n.BMCAddress, &n.BMCUsernameRef, &n.BMCPasswordRef, &n.BMCFingerprint, &n.ProductUUID, &n.DeployProfile,
		&n.DeployImage, &n.WipeMode, &n.BatchID, &n.VerbFrom, &n.VerbBy, &n.LingerCommand, &n.BootMode, &n.UserDataRef,
		&n.UserDataSHA256, &x.drivers, &x.labels, &x.macs, &x.conds}
}

// nodePowerText is the power's place in nodeTexts.
const nodePowerText = 12

// nodeNums are pointers to n's numbers (its identity generation and version as x holds them).
func nodeNums(n *Node, x *nodeTextCols) [nodeNumCount]*int64 {
	return [nodeNumCount]*int64{&n.LingerUntil, &n.CreatedAt, &n.UpdatedAt, &n.UserDataSize, &x.gen, &x.ver}
}

// packNode packs n, whose JSON columns are x's, as the row at rowid row.
func packNode(n Node, x nodeTextCols, row int64) *cachedNode {
	x.gen, x.ver = int64(n.IdentityGeneration), int64(n.Version)
	e := &cachedNode{row: row}
	texts := nodeTexts(&n, &x)
	size := 0
	for _, p := range texts {
		size += len(*p)
	}
	var b strings.Builder
	b.Grow(size)
	for i, p := range texts {
		b.WriteString(*p)
		e.ends[i] = uint32(b.Len())
	}
	e.text = b.String()
	for i, p := range nodeNums(&n, &x) {
		e.nums[i] = *p
	}
	if n.Maintenance {
		e.flags |= flagMaintenance
	}
	if n.BMCInsecure {
		e.flags |= flagBMCInsecure
	}
	return e
}

// unpack returns the node e holds, node id's (its maps and MACs decoded, its own), and its JSON
// columns, its strings from texts (see fields).
func (e *cachedNode) unpack(id string, texts *textCache) (Node, nodeTextCols, error) {
	n, x := e.fields(id, texts)
	return n, x, decodeNodeCols(&n, x)
}

// fields returns the node e holds, node id's, without its maps and MACs (nil), and its JSON
// columns. Its id is id; every other text column is a string of its own from texts (the string
// it handed out for the same bytes before, for values that recur: a tenant, a state), never a
// slice of e.text: any string handed out would keep the whole row alive (a command, an event, a
// workflow keeps the node's id, and the maps decoded from the JSON keep slices of it). With
// texts nil they are slices of e.text, for a row packed again at once (repack).
func (e *cachedNode) fields(id string, texts *textCache) (Node, nodeTextCols) {
	var n Node
	var x nodeTextCols
	start := e.ends[0]
	for i, p := range nodeTexts(&n, &x) {
		if i == 0 {
			*p = id
			continue
		}
		end := e.ends[i]
		if end > start {
			v := e.text[start:end]
			if texts != nil {
				*p = texts.text(unsafe.Slice(unsafe.StringData(v), len(v)))
			} else {
				*p = v
			}
		}
		start = end
	}
	for i, p := range nodeNums(&n, &x) {
		*p = e.nums[i]
	}
	n.Maintenance, n.BMCInsecure = e.flags&flagMaintenance != 0, e.flags&flagBMCInsecure != 0
	n.IdentityGeneration, n.Version = uint64(x.gen), uint64(x.ver)
	return n, x
}

// nodeUpdated is the node row UpdateNode leaves when it writes n over was (the row as stored,
// at n's version), with conditions conds (n's, encoded) at time at: the columns its statement
// sets are n's, the state too when setState and the batch when setBatch, and the rest stay
// was's. Pure.
func nodeUpdated(was Node, wasCols nodeTextCols, n *Node, conds string, setState, setBatch bool, at int64) (Node, nodeTextCols) {
	w := was
	w.TargetState, w.ChainVerb, w.FailedFrom, w.FaultCode, w.FaultMsg = n.TargetState, n.ChainVerb, n.FailedFrom, n.FaultCode, n.FaultMsg
	w.Maintenance, w.MaintenanceReason, w.Power, w.DeployProfile, w.DeployImage = n.Maintenance, n.MaintenanceReason, n.Power, n.DeployProfile, n.DeployImage
	w.WipeMode, w.IdentityGeneration, w.VerbFrom, w.VerbBy = n.WipeMode, n.IdentityGeneration, n.VerbFrom, n.VerbBy
	w.BMCUsernameRef, w.BMCPasswordRef, w.LingerUntil, w.LingerCommand, w.BootMode = n.BMCUsernameRef, n.BMCPasswordRef, n.LingerUntil, n.LingerCommand, n.BootMode
	w.Version, w.UpdatedAt = was.Version+1, at
	if setState {
		w.State = n.State
	}
	if setBatch {
		w.BatchID = n.BatchID
	}
	x := wasCols
	x.conds = conds
	return w, x
}

// node returns node id's row as the cache holds it (its own copy), and whether it holds it.
func (rc *workflowCache) node(id string) (Node, bool) {
	if rc == nil {
		return Node{}, false
	}
	rc.apply()
	rc.nodeReads.Add(1)
	e, ok := rc.nodes.get(id)
	if !ok {
		return Node{}, false
	}
	n, _, err := e.unpack(id, rc.texts)
	if err != nil {
		// (Its JSON decoded when its row was read, so this does not happen; a read of the row
		// would say what is wrong.)
		rc.nodes.take(id)
		return Node{}, false
	}
	rc.nodeHits.Add(1)
	return n, true
}

// nodeHolds says whether the cache holds node id's row with text column col (its place in
// nodeTexts, not the id's) equal to v: a statement that would set it to v changes nothing.
func (rc *workflowCache) nodeHolds(id string, col int, v string) bool {
	if rc == nil || col < 1 || col >= nodeTextCount {
		return false
	}
	rc.apply()
	e, ok := rc.nodes.get(id)
	return ok && e.text[e.ends[col-1]:e.ends[col]] == v
}

// putNode caches n, with its JSON columns x, as the row at rowid row: as a statement of the
// writer just read or left it.
func (rc *workflowCache) putNode(n Node, x nodeTextCols, row int64) {
	if rc == nil {
		return
	}
	rc.apply()
	rc.nodes.put(n.ID, packNode(n, x, row))
}

// takeNode takes node id's entry out of the cache, for a statement that changes its row: the
// caller puts back what the statement left (keepNode), or nothing.
func (rc *workflowCache) takeNode(id string) (*cachedNode, bool) {
	if rc == nil {
		return nil, false
	}
	rc.apply()
	return rc.nodes.take(id)
}

// keepNode puts e in the cache as node id's entry: its row as a statement of the writer just
// left it (taken out before the statement, and repacked if it changed the row).
func (rc *workflowCache) keepNode(id string, e *cachedNode) {
	if rc == nil || e == nil {
		return
	}
	rc.apply()
	rc.nodes.put(id, e)
}

// repack is the entry of node id's row as change leaves e's, at the same rowid.
func (e *cachedNode) repack(id string, change func(Node, nodeTextCols) (Node, nodeTextCols)) *cachedNode {
	n, x := e.fields(id, nil) // (packed again at once: slices of e.text do)
	n, x = change(n, x)
	return packNode(n, x, e.row)
}

// onNode runs stmt, a statement of the writer on node id's row that changes only columns the
// cache does not hold, or those that change sets: the cache's entry is taken out before it and
// put back after it, changed by change (nil: as it was). stmt gets the row's rowid where the
// cache held it (0: not known; see updateByRow). On PostgreSQL it runs stmt alone.
func (t *Tx) onNode(id string, change func(Node) Node, stmt func(row int64) error) error {
	rc := t.rows()
	was, _ := rc.takeNode(id)
	var row int64
	if was != nil {
		row = was.row
	}
	if err := stmt(row); err != nil {
		return err
	}
	if was == nil {
		return nil
	}
	if change != nil {
		was = was.repack(id, func(n Node, x nodeTextCols) (Node, nodeTextCols) { return change(n), x })
	}
	rc.keepNode(id, was)
	return nil
}
