package store

// cachedNode is a node's row as the SQLite writer read or last changed it, at rowid row: its
// text columns (the JSON of its maps and MACs as stored) in texts, its numbers in nums, its flags
// in flags. A node read from it shares its strings (they do not change) and decodes its maps and
// MACs from their JSON, as a read of the row does, so each read has maps of its own.
//
// (A node held as its Node value, maps decoded, added about 60 MiB of resident memory at 10 000
// nodes, and the collector's work on it. Its text columns held as one string, each column a
// slice of it, made every string handed out keep the whole row alive: commands, events and
// workflows that kept a node's id kept its rows, 35 to 90 MiB at 10 000 nodes.)
type cachedNode struct {
	texts [nodeTextCount]string
	nums  [nodeNumCount]int64
	flags uint8
	row   int64
}

func (e *cachedNode) rowid() int64 { return e.row }

const (
	nodeTextCount = 34
	nodeNumCount  = 6

	flagMaintenance = 1 << iota
	flagBMCInsecure
)

// nodeTexts are pointers to n's text columns, and to x's JSON ones (drivers, labels, MACs,
// conditions), in the order the cache packs them.
func nodeTexts(n *Node, x *nodeTextCols) [nodeTextCount]*string {
	return [nodeTextCount]*string{&n.ID, &n.TenantID, &n.SiteID, &n.PoolID, &n.Name, &n.State, &n.TargetState, &n.ChainVerb,
		&n.FailedFrom, &n.FaultCode, &n.FaultMsg, &n.MaintenanceReason, &n.Power, &n.HardwareProfile, &n.BMCDriver,
		&n.BMCAddress, &n.BMCUsernameRef, &n.BMCPasswordRef, &n.BMCFingerprint, &n.ProductUUID, &n.DeployProfile,
		&n.DeployImage, &n.WipeMode, &n.BatchID, &n.VerbFrom, &n.VerbBy, &n.LingerCommand, &n.BootMode, &n.UserDataRef,
		&n.UserDataSHA256, &x.drivers, &x.labels, &x.macs, &x.conds}
}

// nodeNums are pointers to n's numbers (its identity generation and version as x holds them).
func nodeNums(n *Node, x *nodeTextCols) [nodeNumCount]*int64 {
	return [nodeNumCount]*int64{&n.LingerUntil, &n.CreatedAt, &n.UpdatedAt, &n.UserDataSize, &x.gen, &x.ver}
}

// packNode packs n, whose JSON columns are x's, as the row at rowid row.
func packNode(n Node, x nodeTextCols, row int64) *cachedNode {
	x.gen, x.ver = int64(n.IdentityGeneration), int64(n.Version)
	e := &cachedNode{row: row}
	for i, p := range nodeTexts(&n, &x) {
		e.texts[i] = *p
	}
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

// unpack returns the node e holds, its maps and MACs decoded (its own), and its JSON columns.
func (e *cachedNode) unpack() (Node, nodeTextCols, error) {
	n, x := e.fields()
	return n, x, decodeNodeCols(&n, x)
}

// fields returns the node e holds without its maps and MACs (nil), and its JSON columns.
func (e *cachedNode) fields() (Node, nodeTextCols) {
	var n Node
	var x nodeTextCols
	for i, p := range nodeTexts(&n, &x) {
		*p = e.texts[i]
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
func (rc *workflowCache) node(id string) (Node, nodeTextCols, bool) {
	if rc == nil {
		return Node{}, nodeTextCols{}, false
	}
	rc.apply()
	rc.nodeReads.Add(1)
	e, ok := rc.nodes.get(id)
	if !ok {
		return Node{}, nodeTextCols{}, false
	}
	n, x, err := e.unpack()
	if err != nil {
		// (It decoded as the row was read: never, but a read of the row says what is wrong.)
		rc.nodes.take(id)
		return Node{}, nodeTextCols{}, false
	}
	rc.nodeHits.Add(1)
	return n, x, true
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
// caller puts back what the statement left (putNode), or nothing.
func (rc *workflowCache) takeNode(id string) (*cachedNode, bool) {
	if rc == nil {
		return nil, false
	}
	rc.apply()
	return rc.nodes.take(id)
}

// restoreNode puts e back in the cache: the row as a statement of the writer left it unchanged.
func (rc *workflowCache) restoreNode(e *cachedNode) {
	if rc == nil || e == nil {
		return
	}
	rc.apply()
	rc.nodes.put(e.texts[0], e)
}

// onNode runs stmt, a statement of the writer on node id's row that changes only columns the
// cache does not hold, or those that change sets: the cache's entry is taken out before it and
// put back after it, changed by change (nil: as it was). On PostgreSQL it runs stmt alone.
func (t *Tx) onNode(id string, change func(Node) Node, stmt func() error) error {
	rc := t.rows()
	was, _ := rc.takeNode(id)
	if err := stmt(); err != nil {
		return err
	}
	if was == nil {
		return nil
	}
	if change == nil {
		rc.restoreNode(was)
		return nil
	}
	n, x := was.fields()
	rc.putNode(change(n), x, was.row)
	return nil
}
