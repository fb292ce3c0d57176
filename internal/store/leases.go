package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ---------------------------------------------------------------- boot lease (DESIGN §6)

// SiteLease is a site's boot lease row.
type SiteLease struct {
	SiteID     string
	Holder     string // "" when none
	Epoch      uint64 // bumped each time the lease changes hands: the fencing token
	ExpiresAt  int64
	AcquiredAt int64
	// EntriesRev is the revision of the site's newest boot_entries row.
	EntriesRev uint64
}

// HeldBy reports whether agent holds the lease at time at.
func (l SiteLease) HeldBy(agent string, at int64) bool {
	return l.Holder != "" && l.Holder == agent && l.ExpiresAt > at
}

// LeaseDecision is what an acquire does to a lease row. Pure, from the row alone.
type LeaseDecision int

const (
	LeaseRenew  LeaseDecision = iota // agent holds it: extend
	LeaseTake                        // free or lapsed: agent takes it, epoch+1
	LeaseRefuse                      // another agent's lease runs
)

// DecideLease decides an acquire by agent at time at.
func DecideLease(l SiteLease, agent string, at int64) LeaseDecision {
	switch {
	case l.Holder == agent && agent != "" && l.ExpiresAt > at:
		return LeaseRenew
	case l.Holder != "" && l.Holder != agent && l.ExpiresAt > at:
		return LeaseRefuse
	case l.Holder == agent && agent != "":
		// Lapsed but nobody took it: the same holder goes on under the same epoch.
		return LeaseRenew
	default:
		return LeaseTake
	}
}

const leaseCols = `site_id, holder, epoch, expires_at, acquired_at, entries_rev`

func scanLease(r interface{ Scan(...any) error }) (SiteLease, error) {
	var l SiteLease
	var epoch, rev int64
	if err := r.Scan(&l.SiteID, &l.Holder, &epoch, &l.ExpiresAt, &l.AcquiredAt, &rev); err != nil {
		return SiteLease{}, err
	}
	l.Epoch, l.EntriesRev = uint64(epoch), uint64(rev)
	return l, nil
}

// lockLease reads (creating it empty when missing) and, on PostgreSQL, locks a site's lease row.
func (t *Tx) lockLease(ctx context.Context, siteID string) (SiteLease, error) {
	if _, err := t.exec(ctx, `INSERT INTO leases (site_id) VALUES (?) ON CONFLICT (site_id) DO NOTHING`, siteID); err != nil {
		return SiteLease{}, fmt.Errorf("creating the boot lease of site %s: %w", siteID, err)
	}
	l, err := scanLease(t.queryRow(ctx, `SELECT `+leaseCols+` FROM leases WHERE site_id = ?`+t.forUpdate(), siteID))
	if err != nil {
		return SiteLease{}, fmt.Errorf("reading the boot lease of site %s: %w", siteID, err)
	}
	return l, nil
}

// AcquireLease takes or renews site's boot lease for agent until now+ttl, or refuses while
// another agent's lease runs. It returns the lease as it stands afterwards, what was decided and
// the holder before (when the lease changed hands).
func (t *Tx) AcquireLease(ctx context.Context, siteID, agent string, ttl time.Duration) (SiteLease, LeaseDecision, string, error) {
	if agent == "" {
		return SiteLease{}, LeaseRefuse, "", errors.New("acquiring a boot lease: the agent is required")
	}
	l, err := t.lockLease(ctx, siteID)
	if err != nil {
		return SiteLease{}, LeaseRefuse, "", err
	}
	prev := l.Holder
	d := DecideLease(l, agent, t.at)
	switch d {
	case LeaseRefuse:
		return l, d, prev, nil
	case LeaseTake:
		l.Holder, l.Epoch, l.AcquiredAt = agent, l.Epoch+1, t.at
	}
	l.ExpiresAt = t.at + ttl.Microseconds()
	if _, err := t.exec(ctx, `UPDATE leases SET holder = ?, epoch = ?, expires_at = ?, acquired_at = ? WHERE site_id = ?`,
		l.Holder, int64(l.Epoch), l.ExpiresAt, l.AcquiredAt, siteID); err != nil {
		return SiteLease{}, LeaseRefuse, "", fmt.Errorf("writing the boot lease of site %s: %w", siteID, err)
	}
	return l, d, prev, nil
}

// ReleaseLease hands the lease back when agent holds it (another agent may take it at once).
func (t *Tx) ReleaseLease(ctx context.Context, siteID, agent string) error {
	if _, err := t.exec(ctx, `UPDATE leases SET holder = '', expires_at = 0 WHERE site_id = ? AND holder = ?`, siteID, agent); err != nil {
		return fmt.Errorf("releasing the boot lease of site %s: %w", siteID, err)
	}
	return nil
}

// LeaseOf reads a site's boot lease in the transaction (an empty one when none was ever taken).
func (t *Tx) LeaseOf(ctx context.Context, siteID string) (SiteLease, error) {
	l, err := scanLease(t.queryRow(ctx, `SELECT `+leaseCols+` FROM leases WHERE site_id = ?`, siteID))
	if errors.Is(err, sql.ErrNoRows) {
		return SiteLease{SiteID: siteID}, nil
	}
	if err != nil {
		return SiteLease{}, fmt.Errorf("reading the boot lease of site %s: %w", siteID, err)
	}
	return l, nil
}

// Lease returns a site's boot lease (an empty one when none was ever taken).
func (s *Store) Lease(ctx context.Context, siteID string) (SiteLease, error) {
	l, err := scanLease(s.queryRow(ctx, `SELECT `+leaseCols+` FROM leases WHERE site_id = ?`, siteID))
	if errors.Is(err, sql.ErrNoRows) {
		return SiteLease{SiteID: siteID}, nil
	}
	if err != nil {
		return SiteLease{}, fmt.Errorf("reading the boot lease of site %s: %w", siteID, err)
	}
	return l, nil
}

// ---------------------------------------------------------------- boot entries

// Boot entry kinds as boot_entries keeps them.
const (
	BootEntryRamdisk  = "ramdisk"
	BootEntryInstance = "instance"
	BootEntryRemoved  = "removed"
	// BootEntrySanboot: an ISO pinned at the site booted with iPXE sanboot (bmc.media insert
	// where the BMC has no virtual media).
	BootEntrySanboot = "sanboot"
)

// BootISO is the ISO of a sanboot entry, as the site cache fetches and verifies it.
type BootISO struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// BootEntry is a node's boot entry as its last succeeded boot.* command left it. It holds no
// token: a push mints a fresh one.
type BootEntry struct {
	SiteID, NodeID string
	Kind           string // BootEntryRamdisk, BootEntryInstance, BootEntrySanboot, BootEntryRemoved
	MACs           []string
	Local          string   // local-boot method of instance entries
	ISO            *BootISO // sanboot entries only
	Generation     uint64   // the node's identity generation the command was made for
	CommandID      string   // the command that installed it
	AgentID        string   // the agent that ran that command (it has the entry already)
	Revision       uint64
	UpdatedAt      int64
}

// PutBootEntry records a node's entry under the site's next entry revision.
func (t *Tx) PutBootEntry(ctx context.Context, e *BootEntry) error {
	switch e.Kind {
	case BootEntryRamdisk, BootEntryInstance, BootEntryRemoved:
		if e.ISO != nil {
			return fmt.Errorf("boot entry of node %s: a %s entry has no ISO", e.NodeID, e.Kind)
		}
	case BootEntrySanboot:
		if e.ISO == nil || e.ISO.URL == "" || e.ISO.SHA256 == "" || e.ISO.Name == "" {
			return fmt.Errorf("boot entry of node %s: a sanboot entry needs its ISO (name, url, sha256)", e.NodeID)
		}
	default:
		return fmt.Errorf("boot entry of node %s: kind %q: accepted are ramdisk, instance, sanboot, removed", e.NodeID, e.Kind)
	}
	iso := ""
	if e.ISO != nil {
		iso = mustJSON(e.ISO)
	}
	// One statement creates the site's lease row if need be, locks it (before any join token,
	// as BootLease does) and bumps the entries' revision.
	var rev int64
	if err := t.queryRow(ctx, `INSERT INTO leases (site_id, entries_rev) VALUES (?, 1)
		ON CONFLICT (site_id) DO UPDATE SET entries_rev = leases.entries_rev + 1 RETURNING entries_rev`, e.SiteID).Scan(&rev); err != nil {
		return fmt.Errorf("bumping the boot entries of site %s: %w", e.SiteID, err)
	}
	e.Revision, e.UpdatedAt = uint64(rev), t.at
	macs := e.MACs
	if macs == nil {
		macs = []string{}
	}
	return t.execLater(ctx, "recording the boot entry of node "+e.NodeID, `INSERT INTO boot_entries (site_id, node_id, kind, macs, local_boot, generation, command_id, agent_id, revision, updated_at, iso)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (site_id, node_id) DO UPDATE SET kind = excluded.kind, macs = excluded.macs,
		local_boot = excluded.local_boot, generation = excluded.generation, command_id = excluded.command_id, agent_id = excluded.agent_id,
		revision = excluded.revision, updated_at = excluded.updated_at, iso = excluded.iso`,
		t.args(&e.SiteID, &e.NodeID, &e.Kind, mustJSON(macs), &e.Local, &e.Generation, &e.CommandID, &e.AgentID, &e.Revision, &t.at, iso)...)
}

const bootEntryCols = `site_id, node_id, kind, macs, local_boot, generation, command_id, agent_id, revision, updated_at, iso`

func scanBootEntry(r interface{ Scan(...any) error }) (BootEntry, error) {
	var e BootEntry
	var macs, iso string
	var gen, rev int64
	if err := r.Scan(&e.SiteID, &e.NodeID, &e.Kind, &macs, &e.Local, &gen, &e.CommandID, &e.AgentID, &rev, &e.UpdatedAt, &iso); err != nil {
		return BootEntry{}, err
	}
	if iso != "" {
		e.ISO = &BootISO{}
		if err := json.Unmarshal([]byte(iso), e.ISO); err != nil {
			return BootEntry{}, fmt.Errorf("boot entry of node %s: iso: %w", e.NodeID, err)
		}
	}
	e.Generation, e.Revision = uint64(gen), uint64(rev)
	if err := json.Unmarshal([]byte(macs), &e.MACs); err != nil {
		return BootEntry{}, fmt.Errorf("boot entry of node %s: macs: %w", e.NodeID, err)
	}
	return e, nil
}

// BootEntries lists a site's entries with a revision above after, oldest revision first:
// after 0 lists the whole table without removed entries; a delta (after > 0) includes them.
func (t *Tx) BootEntries(ctx context.Context, siteID string, after uint64) ([]BootEntry, error) {
	q := `SELECT ` + bootEntryCols + ` FROM boot_entries WHERE site_id = ? AND revision > ?`
	if after == 0 {
		q += ` AND kind <> 'removed'`
	}
	rows, err := t.query(ctx, q+` ORDER BY revision`, siteID, int64(after))
	return collect(rows, err, "boot entries", scanBootEntry)
}

// ---------------------------------------------------------------- power polling

// SetPolledPower records the power axis as a poll read it. Unlike SetPower (a step's result,
// written with the node's reconcile), it bumps the node's version: a writer holding an older
// copy of the node must not write the old power back.
func (t *Tx) SetPolledPower(ctx context.Context, nodeID, power string) error {
	if _, err := t.exec(ctx, `UPDATE nodes SET power = ?, version = version + 1, updated_at = ? WHERE id = ?`, power, t.at, nodeID); err != nil {
		return fmt.Errorf("recording the power of node %s: %w", nodeID, err)
	}
	return nil
}

// PollTarget is a node whose power a site's lease holder polls.
type PollTarget struct {
	NodeID string
	BMC    BMCRef
}

// PollTargets lists the nodes of a site with a BMC binding, retired ones excepted.
func (t *Tx) PollTargets(ctx context.Context, siteID string) ([]PollTarget, error) {
	rows, err := t.query(ctx, `SELECT id, bmc_driver, bmc_address, bmc_username_ref, bmc_password_ref, bmc_insecure, bmc_fingerprint
		FROM nodes WHERE site_id = ? AND bmc_address <> '' AND state <> 'retired' ORDER BY id`, siteID)
	return collect(rows, err, "nodes to poll", func(r interface{ Scan(...any) error }) (PollTarget, error) {
		var p PollTarget
		err := r.Scan(&p.NodeID, &p.BMC.Driver, &p.BMC.Address, &p.BMC.UsernameRef, &p.BMC.PasswordRef, &p.BMC.InsecureTLS, &p.BMC.FingerprintSHA256)
		return p, err
	})
}

// PowerPoll is a node's polling record.
type PowerPoll struct {
	NodeID           string
	Failures         int
	UnreachableSince int64 // 0: BMC_UNREACHABLE not raised
	LastError        string
	LastOKAt         int64
	UpdatedAt        int64
}

// LockPowerPoll reads a node's polling record (zero when none).
func (t *Tx) LockPowerPoll(ctx context.Context, nodeID string) (PowerPoll, error) {
	p := PowerPoll{NodeID: nodeID}
	err := t.queryRow(ctx, `SELECT failures, unreachable_since, last_error, last_ok_at, updated_at FROM power_polls WHERE node_id = ?`+t.forUpdate(), nodeID).
		Scan(&p.Failures, &p.UnreachableSince, &p.LastError, &p.LastOKAt, &p.UpdatedAt)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return PowerPoll{}, fmt.Errorf("reading power polling of node %s: %w", nodeID, err)
	}
	return p, nil
}

// PutPowerPoll writes a node's polling record.
func (t *Tx) PutPowerPoll(ctx context.Context, p PowerPoll) error {
	_, err := t.exec(ctx, `INSERT INTO power_polls (node_id, failures, unreachable_since, last_error, last_ok_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (node_id) DO UPDATE SET failures = excluded.failures, unreachable_since = excluded.unreachable_since,
		last_error = excluded.last_error, last_ok_at = excluded.last_ok_at, updated_at = excluded.updated_at`,
		p.NodeID, p.Failures, p.UnreachableSince, p.LastError, p.LastOKAt, t.at)
	if err != nil {
		return fmt.Errorf("recording power polling of node %s: %w", p.NodeID, err)
	}
	return nil
}

// PowerPoll returns a node's polling record (zero when none).
func (s *Store) PowerPoll(ctx context.Context, nodeID string) (PowerPoll, error) {
	p := PowerPoll{NodeID: nodeID}
	err := s.queryRow(ctx, `SELECT failures, unreachable_since, last_error, last_ok_at, updated_at FROM power_polls WHERE node_id = ?`, nodeID).
		Scan(&p.Failures, &p.UnreachableSince, &p.LastError, &p.LastOKAt, &p.UpdatedAt)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return PowerPoll{}, fmt.Errorf("reading power polling of node %s: %w", nodeID, err)
	}
	return p, nil
}

// ---------------------------------------------------------------- DHCP leases

// DHCPLease is an address a site agent's DHCP (full mode) leased to a MAC until Expires
// (microseconds; 0: the lease ended).
type DHCPLease struct {
	MAC     string // lower case, colon-separated
	IP      string // IPv4, dotted
	Expires int64
}

// dhcpAddressRetakenQuery removes a site's lease of an address another MAC now holds (one
// statement per lease reported: site_dhcp_leases_ip keeps it from reading the site's leases).
const dhcpAddressRetakenQuery = `DELETE FROM site_dhcp_leases WHERE site_id = ? AND ip = ? AND mac <> ?`

// PutDHCPLeases records what the site's boot-lease holder reported: a running lease replaces
// the MAC's earlier one and any other MAC's lease of the same address; an ended one (Expires at
// or before the transaction's time) removes the MAC's lease of that address. Leases that ran
// out are deleted on the way.
func (t *Tx) PutDHCPLeases(ctx context.Context, siteID string, ls []DHCPLease) error {
	if len(ls) == 0 {
		return nil
	}
	if _, err := t.exec(ctx, `DELETE FROM site_dhcp_leases WHERE site_id = ? AND expires_at <= ?`, siteID, t.at); err != nil {
		return fmt.Errorf("deleting the ended DHCP leases of site %s: %w", siteID, err)
	}
	for _, l := range ls {
		if l.Expires <= t.at {
			if _, err := t.exec(ctx, `DELETE FROM site_dhcp_leases WHERE site_id = ? AND mac = ? AND ip = ?`, siteID, l.MAC, l.IP); err != nil {
				return fmt.Errorf("ending the DHCP lease of %s at site %s: %w", l.MAC, siteID, err)
			}
			continue
		}
		if _, err := t.exec(ctx, dhcpAddressRetakenQuery, siteID, l.IP, l.MAC); err != nil {
			return fmt.Errorf("recording the DHCP lease of %s at site %s: %w", l.MAC, siteID, err)
		}
		if _, err := t.exec(ctx, `INSERT INTO site_dhcp_leases (site_id, mac, ip, expires_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (site_id, mac) DO UPDATE SET ip = excluded.ip, expires_at = excluded.expires_at`, siteID, l.MAC, l.IP, l.Expires); err != nil {
			return fmt.Errorf("recording the DHCP lease of %s at site %s: %w", l.MAC, siteID, err)
		}
	}
	return nil
}

// DHCPLeases lists the site's DHCP leases still running at the transaction's time, by address.
func (t *Tx) DHCPLeases(ctx context.Context, siteID string) ([]DHCPLease, error) {
	rows, err := t.query(ctx, `SELECT mac, ip, expires_at FROM site_dhcp_leases WHERE site_id = ? AND expires_at > ? ORDER BY ip`, siteID, t.at)
	return collect(rows, err, "DHCP leases", func(r interface{ Scan(...any) error }) (DHCPLease, error) {
		var l DHCPLease
		return l, r.Scan(&l.MAC, &l.IP, &l.Expires)
	})
}

// PurgeDHCPLeases deletes up to limit DHCP leases that ended before before, of any site (one
// that stopped reporting, or was removed, keeps none for ever).
func (t *Tx) PurgeDHCPLeases(ctx context.Context, before int64, limit int) (int, error) {
	res, err := t.exec(ctx, `DELETE FROM site_dhcp_leases WHERE (site_id, mac) IN (SELECT site_id, mac FROM site_dhcp_leases
		WHERE expires_at < ? LIMIT ?)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting ended DHCP leases: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// NodeAddresses lists the DHCP leases still running of a node's MACs at its site, by address.
func (s *Store) NodeAddresses(ctx context.Context, nodeID string) ([]DHCPLease, error) {
	rows, err := s.queryRows(ctx, `SELECT l.mac, l.ip, l.expires_at FROM site_dhcp_leases l
		JOIN node_macs m ON m.mac = l.mac JOIN nodes n ON n.id = m.node_id AND n.site_id = l.site_id
		WHERE m.node_id = ? AND l.expires_at > ? ORDER BY l.ip`, nodeID, s.nowMicros())
	return collect(rows, err, "addresses of node "+nodeID, func(r interface{ Scan(...any) error }) (DHCPLease, error) {
		var l DHCPLease
		return l, r.Scan(&l.MAC, &l.IP, &l.Expires)
	})
}
