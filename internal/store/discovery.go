package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
)

// MAC candidate states.
const (
	CandidatePending   = "pending"   // waits for an operator's metal.confirmMac
	CandidateConfirmed = "confirmed" // an operator confirmed it: bound to the node
	CandidateBound     = "bound"     // bound at once (the pool trusts its provisioning network)
	CandidateExpired   = "expired"   // not confirmed before its step's deadline
)

// MACCandidate is the MAC a MAC-less node was seen PXE-booting with under its product UUID
// after its workflow's power cycle.
type MACCandidate struct {
	NodeID, WorkflowID, SiteID, MAC, UUID string
	SeenAt, CreatedAt                     int64
	State, DecidedBy                      string
	DecidedAt                             int64
}

const candidateCols = `node_id, workflow_id, site_id, mac, uuid, seen_at, created_at, state, decided_by, decided_at`

func scanCandidate(r interface{ Scan(...any) error }) (MACCandidate, error) {
	var c MACCandidate
	err := r.Scan(&c.NodeID, &c.WorkflowID, &c.SiteID, &c.MAC, &c.UUID, &c.SeenAt, &c.CreatedAt, &c.State, &c.DecidedBy, &c.DecidedAt)
	return c, err
}

// PutMACCandidate records (or replaces) the node's candidate.
func (t *Tx) PutMACCandidate(ctx context.Context, c MACCandidate) error {
	if c.CreatedAt == 0 {
		c.CreatedAt = t.at
	}
	_, err := t.exec(ctx, `INSERT INTO mac_candidates (`+candidateCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (node_id) DO UPDATE SET workflow_id = excluded.workflow_id, site_id = excluded.site_id, mac = excluded.mac,
		uuid = excluded.uuid, seen_at = excluded.seen_at, created_at = excluded.created_at, state = excluded.state,
		decided_by = excluded.decided_by, decided_at = excluded.decided_at`,
		c.NodeID, c.WorkflowID, c.SiteID, c.MAC, c.UUID, c.SeenAt, c.CreatedAt, c.State, c.DecidedBy, c.DecidedAt)
	if err != nil {
		return fmt.Errorf("recording MAC candidate %s of node %s: %w", c.MAC, c.NodeID, err)
	}
	return nil
}

// MACCandidate returns the node's candidate; ok is false when it has none.
func (t *Tx) MACCandidate(ctx context.Context, nodeID string) (MACCandidate, bool, error) {
	c, err := scanCandidate(t.queryRow(ctx, `SELECT `+candidateCols+` FROM mac_candidates WHERE node_id = ?`, nodeID))
	if errors.Is(err, sql.ErrNoRows) {
		return MACCandidate{}, false, nil
	}
	if err != nil {
		return MACCandidate{}, false, fmt.Errorf("reading MAC candidate of node %s: %w", nodeID, err)
	}
	return c, true, nil
}

// MACCandidates lists the candidates of a site's nodes in state (all states when empty), newest first.
func (s *Store) MACCandidates(ctx context.Context, siteID, state string) ([]MACCandidate, error) {
	rows, err := s.queryRows(ctx, `SELECT `+candidateCols+` FROM mac_candidates WHERE site_id = ? AND (? = '' OR state = ?) ORDER BY created_at DESC`, siteID, state, state)
	return collect(rows, err, "MAC candidates", scanCandidate)
}

// Sightings lists what site agents saw PXE-booting under either of two UUID spellings (the
// same UUID in its two SMBIOS byte orders) and last saw at or after since, at every site.
func (t *Tx) Sightings(ctx context.Context, uuidA, uuidB string, since int64) ([]Discovery, error) {
	rows, err := t.query(ctx, `SELECT `+discoveryCols+` FROM discovered WHERE uuid IN (?, ?) AND last_seen >= ? ORDER BY first_seen, mac`, uuidA, uuidB, since)
	return collect(rows, err, "sightings of a UUID", scanDiscovery)
}

// MACOwner returns the node a MAC belongs to, "" when none.
func (t *Tx) MACOwner(ctx context.Context, mac string) (string, error) {
	var id string
	err := t.queryRow(ctx, `SELECT node_id FROM node_macs WHERE mac = ?`, mac).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("looking up the owner of MAC %s: %w", mac, err)
	}
	return id, nil
}

// SiteMACOwner is MACOwner among the nodes of site siteID only ("" for a MAC of another site's
// node): what a site agent reports of a MAC concerns its own site's machines only.
func (t *Tx) SiteMACOwner(ctx context.Context, siteID, mac string) (string, error) {
	var id string
	err := t.queryRow(ctx, `SELECT m.node_id FROM node_macs m JOIN nodes n ON n.id = m.node_id WHERE m.mac = ? AND n.site_id = ?`, mac, siteID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("looking up the owner of MAC %s at site %s: %w", mac, siteID, err)
	}
	return id, nil
}

// nodesWithoutMACsQuery finds the nodes of a site without MACs under either of two product
// UUIDs (nodes_site_uuid): a site agent's report runs it for every machine it saw, in the
// writer, and a site's nodes are many.
const nodesWithoutMACsQuery = `SELECT id FROM nodes WHERE site_id = ? AND product_uuid IN (?, ?) AND product_uuid <> ''
	AND NOT EXISTS (SELECT 1 FROM node_macs WHERE node_macs.node_id = nodes.id) ORDER BY id`

// NodesWithoutMACs lists the site's nodes that have no MAC and either of two UUID spellings as
// product UUID (the nodes a sighting under that UUID may concern).
func (t *Tx) NodesWithoutMACs(ctx context.Context, siteID, uuidA, uuidB string) ([]string, error) {
	rows, err := t.query(ctx, nodesWithoutMACsQuery, siteID, uuidA, uuidB)
	return collect(rows, err, "MAC-less nodes of a UUID", scanID)
}

// DiscoveryOf reads what was seen at a site under a MAC.
func (s *Store) DiscoveryOf(ctx context.Context, siteID, mac string) (Discovery, error) {
	d, err := scanDiscovery(s.queryRow(ctx, `SELECT `+discoveryCols+` FROM discovered WHERE site_id = ? AND mac = ?`, siteID, mac))
	if errors.Is(err, sql.ErrNoRows) {
		return Discovery{}, fmt.Errorf("no machine was seen with MAC %s at this site: %w", mac, ErrNotFound)
	}
	if err != nil {
		return Discovery{}, fmt.Errorf("reading discovered MAC %s: %w", mac, err)
	}
	return d, nil
}

// Pending lists a site's machines that a discovery-mode ramdisk reported and nobody decided on
// yet (acceptance "" or, with accepted, also those accepted but not enrolled), whose MAC
// belongs to no node, most recent first.
func (s *Store) Pending(ctx context.Context, siteID string, limit int) ([]Discovery, error) {
	rows, err := s.queryRows(ctx, `SELECT `+discoveryCols+` FROM discovered
		WHERE site_id = ? AND inventory <> '' AND (acceptance = '' OR (acceptance = 'accepted' AND node_id = ''))
		AND mac NOT IN (SELECT mac FROM node_macs) ORDER BY last_seen DESC LIMIT ?`, siteID, limit)
	return collect(rows, err, "pending machines", scanDiscovery)
}

// RecordAcceptance records, in the transaction that enrolls node nodeID, that decidedBy
// accepted the machine seen at site siteID under mac, as the caller read it: seen is the
// acceptance it read before enrolling. It is refused (ok false, d the machine as it is now)
// when an acceptance enrolled the machine meanwhile, or when it was rejected since it was read;
// a machine the caller saw rejected may be accepted (that overrides the rejection). With
// RecordRejection, whichever decision commits first is the one the other sees: never a node
// enrolled by an acceptance while its machine is recorded rejected.
func (t *Tx) RecordAcceptance(ctx context.Context, siteID, mac, nodeID, decidedBy, seen string) (d Discovery, ok bool, err error) {
	res, err := t.exec(ctx, `UPDATE discovered SET acceptance = 'accepted', node_id = ?, decided_by = ?
		WHERE site_id = ? AND mac = ? AND node_id = '' AND (acceptance <> 'rejected' OR acceptance = ?)`,
		nodeID, decidedBy, siteID, mac, seen)
	if err != nil {
		return Discovery{}, false, fmt.Errorf("recording the acceptance of MAC %s: %w", mac, err)
	}
	return t.decided(ctx, siteID, mac, res)
}

// RecordRejection records that decidedBy rejected the machine seen at site siteID under mac,
// unless an acceptance enrolled it: then it is refused (ok false, d the machine as it is now).
func (t *Tx) RecordRejection(ctx context.Context, siteID, mac, decidedBy string) (d Discovery, ok bool, err error) {
	res, err := t.exec(ctx, `UPDATE discovered SET acceptance = 'rejected', decided_by = ? WHERE site_id = ? AND mac = ? AND node_id = ''`,
		decidedBy, siteID, mac)
	if err != nil {
		return Discovery{}, false, fmt.Errorf("recording the rejection of MAC %s: %w", mac, err)
	}
	return t.decided(ctx, siteID, mac, res)
}

// decided is the outcome of a conditional decision on a discovered machine: ok when it was
// recorded, else the machine as it is now (not found when it was never seen at the site).
func (t *Tx) decided(ctx context.Context, siteID, mac string, res sql.Result) (Discovery, bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return Discovery{}, false, fmt.Errorf("recording the decision on MAC %s: %w", mac, err)
	}
	if n > 0 {
		return Discovery{}, true, nil
	}
	d, err := scanDiscovery(t.queryRow(ctx, `SELECT `+discoveryCols+` FROM discovered WHERE site_id = ? AND mac = ?`, siteID, mac))
	if errors.Is(err, sql.ErrNoRows) {
		return Discovery{}, false, fmt.Errorf("no machine was seen with MAC %s at this site: %w", mac, ErrNotFound)
	}
	if err != nil {
		return Discovery{}, false, fmt.Errorf("reading discovered MAC %s: %w", mac, err)
	}
	return d, false, nil
}

// AutoAcceptPools returns the site's pools whose policy says autoAccept, by name.
func (t *Tx) AutoAcceptPools(ctx context.Context, siteID string) ([]Pool, error) {
	rows, err := t.query(ctx, `SELECT `+poolCols+` FROM pools WHERE site_id = ? ORDER BY name`, siteID)
	pools, err := collect(rows, err, "pools of a site", scanPool)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pools, func(p Pool) bool { return !p.Policy.AutoAccept }), nil
}

// AcceptPending marks a discovered machine accepted by actor when nobody decided on it yet;
// it reports whether it did.
func (t *Tx) AcceptPending(ctx context.Context, siteID, mac, actor string) (bool, error) {
	res, err := t.exec(ctx, `UPDATE discovered SET acceptance = 'accepted', decided_by = ? WHERE site_id = ? AND mac = ? AND acceptance = ''
		AND mac NOT IN (SELECT mac FROM node_macs)`, actor, siteID, mac)
	if err != nil {
		return false, fmt.Errorf("accepting MAC %s: %w", mac, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// MaxRejectedMACs bounds the rejected MACs a site's boot-lease holder is told of.
const MaxRejectedMACs = 1000

// RejectedMACs lists the MACs of a site's machines an operator rejected (acceptance flow), most
// recently seen first, at most MaxRejectedMACs: the boot-lease holder tells their waiting
// discovery-mode ramdisks, which power their hosts off.
func (t *Tx) RejectedMACs(ctx context.Context, siteID string) ([]string, error) {
	rows, err := t.query(ctx, `SELECT mac FROM discovered WHERE site_id = ? AND acceptance = 'rejected' ORDER BY last_seen DESC LIMIT ?`, siteID, MaxRejectedMACs)
	return collect(rows, err, "rejected MACs", func(r interface{ Scan(...any) error }) (string, error) {
		var m string
		return m, r.Scan(&m)
	})
}
