package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// NewID returns a UUIDv7 (time-ordered, so new rows append to indexes and ids page in
// creation order, to a quarter of a microsecond).
func NewID(now time.Time) string {
	var b [16]byte
	// 48 bits of milliseconds, then (RFC 9562 method 3) 12 bits of the sub-millisecond
	// fraction, so ids made one after the other sort in creation order.
	sub := uint64(now.Nanosecond()%1_000_000) * 4096 / 1_000_000
	binary.BigEndian.PutUint64(b[0:8], uint64(now.UnixMilli())<<16|0x7000|sub)
	if _, err := rand.Read(b[8:]); err != nil {
		panic(fmt.Sprintf("reading random bytes: %v", err)) // crypto/rand never fails on Linux
	}
	b[8] = 0x80 | b[8]&0x3f
	return FormatUUID(b)
}

// FormatUUID writes u in the canonical form the store's ids take (lower-case hex, dashes after
// the 8th, 12th, 16th and 20th digit). Pure.
func FormatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// Micros converts a stored timestamp to time.
func Micros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

type Tenant struct {
	ID, Name  string
	CreatedAt int64
}

type Site struct {
	ID, TenantID, Name string
	Labels             map[string]string
	CreatedAt          int64
}

// PoolPolicy is a pool's policy JSON.
type PoolPolicy struct {
	HardwareProfile          string            `json:"hardwareProfile"`
	TrustProvisioningNetwork bool              `json:"trustProvisioningNetwork,omitempty"`
	Labels                   map[string]string `json:"labels,omitempty"`
	FirmwareBaseline         map[string]string `json:"firmwareBaseline,omitempty"`
	// FirmwareImages name, per baseline component, the catalog firmware image that brings it
	// to the baseline's version: installed by the BMC at commissioning and release where the
	// component runs another version.
	FirmwareImages map[string]string `json:"firmwareImages,omitempty"`
	// BIOSSettings are the BIOS attributes the pool's machines must have (attribute → value as
	// text), written at commissioning and release and read back after the boot that applies
	// them.
	BIOSSettings map[string]string `json:"biosSettings,omitempty"`
	// AutoAccept: machines a discovery-mode ramdisk reports at the pool's site are accepted
	// into this pool without an operator (acceptance flow). Off by default.
	AutoAccept bool `json:"autoAccept,omitempty"`
	// AutoAcceptInband (with AutoAccept): what the pool accepts it also enrolls, with an in-band
	// BMC credential (accept --inband). Off by default.
	AutoAcceptInband bool `json:"autoAcceptInband,omitempty"`
	// FastTrackWindow is how long the ramdisk stays up after commissioning, release or
	// inspection for a workflow to use it without a boot (a Go duration, "10m"); "0s": off
	// (powered off at once); empty: the server's default.
	FastTrackWindow string `json:"fastTrackWindow,omitempty"`
	// HardwareRequirements (hardware.Parse's text) are what the pool's machines must have:
	// checked at every inspection against the inventory their ramdisk reports.
	HardwareRequirements []string `json:"hardwareRequirements,omitempty"`
}

type Pool struct {
	ID, TenantID, SiteID, Name string
	Policy                     PoolPolicy
	CreatedAt                  int64
}

// HardwareProfile binds a driver id to each concern.
type HardwareProfile struct {
	Name      string
	Drivers   map[string]string
	LocalBoot string
}

// Node is a machine's row.
type Node struct {
	ID, TenantID, SiteID, PoolID, Name string
	State, TargetState, ChainVerb      string
	FailedFrom, FaultCode, FaultMsg    string
	Maintenance                        bool
	MaintenanceReason                  string
	Power                              string
	HardwareProfile                    string
	Drivers                            map[string]string
	BMCDriver, BMCAddress              string
	BMCUsernameRef, BMCPasswordRef     string
	BMCInsecure                        bool
	BMCFingerprint                     string
	ProductUUID                        string
	Labels                             map[string]string
	MACs                               []string
	DeployProfile, DeployImage         string
	WipeMode, BatchID                  string
	// VerbFrom is the state the last state-changing verb came from (a rejected batch returns
	// the node there).
	VerbFrom string
	// VerbBy is who applied that verb (the requester of the node's one-node batch).
	VerbBy string
	// Conditions are named observations about the node ("BmcCredentialRotated": "False").
	Conditions map[string]string
	// LingerUntil is when the node's lingering ramdisk (fast track) is told to power its host
	// off, 0 when none lingers; LingerCommand is that power-off command once sent.
	LingerUntil          int64
	LingerCommand        string
	IdentityGeneration   uint64
	Version              uint64
	CreatedAt, UpdatedAt int64
	// BootMode is the firmware mode the node boots in (uefi, legacy; "" leaves the driver's
	// behaviour): the mode of its bmc.boot commands whose step names none.
	BootMode string
	// UserDataRef is the secret:// reference of the operator user-data of the node's deploy
	// ("" when none), with its size and hex SHA-256 (what the API shows). Written only by
	// SetNodeUserData: UpdateNode leaves them as they are.
	UserDataRef    string
	UserDataSHA256 string
	UserDataSize   int64
}

// Event is one row of the append-only audit log.
type Event struct {
	ID                         uint64
	At                         int64
	TenantID, NodeID           string
	Actor, Kind                string
	FromState, ToState, Reason string
	Data                       string
}

// Token is an API token; only the hash of its secret is kept.
type Token struct {
	ID, Name, Role, TenantID, CreatedBy string
	Hash                                []byte
	CreatedAt, RevokedAt                int64
}

// WakeUp is a reconciler wake-up row.
type WakeUp struct {
	NodeID     string
	DueAt      int64
	Reason     string
	EnqueuedAt int64
	Attempts   int
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encoding %T: %v", v, err)) // only maps and slices of strings reach here
	}
	return string(b)
}

func labelsJSON(m map[string]string) string {
	if m == nil {
		return "{}"
	}
	return mustJSON(m)
}

// ---------------------------------------------------------------- tenants, sites, pools

func (t *Tx) InsertTenant(ctx context.Context, name string) (Tenant, error) {
	tn := Tenant{ID: NewID(Micros(t.at)), Name: name, CreatedAt: t.at}
	if _, err := t.exec(ctx, `INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)`, tn.ID, tn.Name, tn.CreatedAt); err != nil {
		if isUnique(err) {
			return Tenant{}, fmt.Errorf("tenant %q: %w", name, ErrConflict)
		}
		return Tenant{}, fmt.Errorf("inserting tenant %q: %w", name, err)
	}
	return tn, nil
}

const tenantCols = `id, name, created_at`

func scanTenant(r interface{ Scan(...any) error }) (Tenant, error) {
	var tn Tenant
	err := r.Scan(&tn.ID, &tn.Name, &tn.CreatedAt)
	return tn, err
}

// Tenant finds a tenant by id or name.
func (s *Store) Tenant(ctx context.Context, ref string) (Tenant, error) {
	tn, err := scanTenant(s.queryRow(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = ? OR name = ?`, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Tenant{}, fmt.Errorf("tenant %q: %w", ref, ErrNotFound)
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("reading tenant %q: %w", ref, err)
	}
	return tn, nil
}

func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.queryRows(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY name`)
	return collect(rows, err, "tenants", scanTenant)
}

func (t *Tx) InsertSite(ctx context.Context, tenantID, name string, labels map[string]string) (Site, error) {
	st := Site{ID: NewID(Micros(t.at)), TenantID: tenantID, Name: name, Labels: labels, CreatedAt: t.at}
	if _, err := t.exec(ctx, `INSERT INTO sites (id, tenant_id, name, labels, created_at) VALUES (?, ?, ?, ?, ?)`,
		st.ID, st.TenantID, st.Name, labelsJSON(labels), st.CreatedAt); err != nil {
		if isUnique(err) {
			return Site{}, fmt.Errorf("site %q: %w", name, ErrConflict)
		}
		return Site{}, fmt.Errorf("inserting site %q: %w", name, err)
	}
	return st, nil
}

const siteCols = `id, tenant_id, name, labels, created_at`

func scanSite(r interface{ Scan(...any) error }) (Site, error) {
	var st Site
	var labels string
	if err := r.Scan(&st.ID, &st.TenantID, &st.Name, &labels, &st.CreatedAt); err != nil {
		return Site{}, err
	}
	if err := json.Unmarshal([]byte(labels), &st.Labels); err != nil {
		return Site{}, fmt.Errorf("decoding labels of site %s: %w", st.ID, err)
	}
	return st, nil
}

// siteQuery reads a site by id or name.
const siteQuery = `SELECT ` + siteCols + ` FROM sites WHERE id = ? OR name = ?`

// siteOf scans a siteQuery row of ref.
func siteOf(row rowScanner, ref string) (Site, error) {
	st, err := scanSite(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Site{}, fmt.Errorf("site %q: %w", ref, ErrNotFound)
	}
	if err != nil {
		return Site{}, fmt.Errorf("reading site %q: %w", ref, err)
	}
	return st, nil
}

// Site reads a site by id or name in the transaction.
func (t *Tx) Site(ctx context.Context, ref string) (Site, error) {
	return siteOf(t.queryRow(ctx, siteQuery, ref, ref), ref)
}

func (s *Store) Site(ctx context.Context, ref string) (Site, error) {
	return siteOf(s.queryRow(ctx, siteQuery, ref, ref), ref)
}

func (s *Store) Sites(ctx context.Context, tenantID string) ([]Site, error) {
	rows, err := s.queryRows(ctx, `SELECT `+siteCols+` FROM sites WHERE ? = '' OR tenant_id = ? ORDER BY name`, tenantID, tenantID)
	return collect(rows, err, "sites", scanSite)
}

func (t *Tx) DeleteSite(ctx context.Context, id string) error {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM pools WHERE site_id = ?`, id).Scan(&n); err != nil {
		return fmt.Errorf("counting pools of site: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("site still has %d pools: delete them first: %w", n, ErrConflict)
	}
	if _, err := t.exec(ctx, `DELETE FROM sites WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting site: %w", err)
	}
	return nil
}

func (t *Tx) InsertPool(ctx context.Context, p Pool) (Pool, error) {
	p.ID = NewID(Micros(t.at))
	p.CreatedAt = t.at
	if _, err := t.exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, policy, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
		p.ID, p.TenantID, p.SiteID, p.Name, mustJSON(p.Policy), p.CreatedAt); err != nil {
		if isUnique(err) {
			return Pool{}, fmt.Errorf("pool %q: %w", p.Name, ErrConflict)
		}
		return Pool{}, fmt.Errorf("inserting pool %q: %w", p.Name, err)
	}
	return p, nil
}

func (t *Tx) UpdatePoolPolicy(ctx context.Context, id string, pol PoolPolicy) error {
	res, err := t.exec(ctx, `UPDATE pools SET policy = ? WHERE id = ?`, mustJSON(pol), id)
	if err != nil {
		return fmt.Errorf("updating pool policy: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("pool %s: %w", id, ErrNotFound)
	}
	return nil
}

func (t *Tx) DeletePool(ctx context.Context, id string) error {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM nodes WHERE pool_id = ?`, id).Scan(&n); err != nil {
		return fmt.Errorf("counting nodes of pool: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("pool still has %d nodes: delete or move them first: %w", n, ErrConflict)
	}
	if _, err := t.exec(ctx, `DELETE FROM pools WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting pool: %w", err)
	}
	return nil
}

const poolCols = `id, tenant_id, site_id, name, policy, created_at`

func scanPool(r interface{ Scan(...any) error }) (Pool, error) {
	var p Pool
	var pol string
	if err := r.Scan(&p.ID, &p.TenantID, &p.SiteID, &p.Name, &pol, &p.CreatedAt); err != nil {
		return Pool{}, err
	}
	if err := json.Unmarshal([]byte(pol), &p.Policy); err != nil {
		return Pool{}, fmt.Errorf("decoding policy of pool %s: %w", p.ID, err)
	}
	return p, nil
}

func (s *Store) Pool(ctx context.Context, ref string) (Pool, error) {
	p, err := scanPool(s.queryRow(ctx, `SELECT `+poolCols+` FROM pools WHERE id = ? OR name = ?`, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Pool{}, fmt.Errorf("pool %q: %w", ref, ErrNotFound)
	}
	if err != nil {
		return Pool{}, fmt.Errorf("reading pool %q: %w", ref, err)
	}
	return p, nil
}

// Pool reads a pool inside a transaction.
func (t *Tx) Pool(ctx context.Context, ref string) (Pool, error) {
	// SQLite's writer keeps the pools it read until a statement changes the table.
	rc := t.rows()
	if v, ok := rc.memo(memoPools, ref); ok {
		return v.(Pool).clone(), nil
	}
	p, err := scanPool(t.queryRow(ctx, `SELECT `+poolCols+` FROM pools WHERE id = ? OR name = ?`, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Pool{}, fmt.Errorf("pool %q: %w", ref, ErrNotFound)
	}
	if err != nil {
		return Pool{}, fmt.Errorf("reading pool %q: %w", ref, err)
	}
	rc.remember(memoPools, ref, p.clone())
	return p, nil
}

// clone is p with maps of its own.
func (p Pool) clone() Pool {
	q := p
	q.Policy.Labels, q.Policy.FirmwareBaseline = maps.Clone(p.Policy.Labels), maps.Clone(p.Policy.FirmwareBaseline)
	q.Policy.FirmwareImages, q.Policy.BIOSSettings = maps.Clone(p.Policy.FirmwareImages), maps.Clone(p.Policy.BIOSSettings)
	return q
}

func (s *Store) Pools(ctx context.Context, tenantID, siteID string) ([]Pool, error) {
	rows, err := s.queryRows(ctx, `SELECT `+poolCols+` FROM pools WHERE (? = '' OR tenant_id = ?) AND (? = '' OR site_id = ?) ORDER BY name`,
		tenantID, tenantID, siteID, siteID)
	return collect(rows, err, "pools", scanPool)
}

// ---------------------------------------------------------------- hardware profiles

func (t *Tx) PutHardwareProfile(ctx context.Context, hp HardwareProfile) error {
	_, err := t.exec(ctx, `INSERT INTO hardware_profiles (name, drivers, local_boot, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET drivers = excluded.drivers, local_boot = excluded.local_boot, updated_at = excluded.updated_at`,
		hp.Name, mustJSON(hp.Drivers), hp.LocalBoot, t.at)
	if err != nil {
		return fmt.Errorf("storing hardware profile %q: %w", hp.Name, err)
	}
	return nil
}

func scanProfile(r interface{ Scan(...any) error }) (HardwareProfile, error) {
	var hp HardwareProfile
	var drivers string
	if err := r.Scan(&hp.Name, &drivers, &hp.LocalBoot); err != nil {
		return HardwareProfile{}, err
	}
	if err := json.Unmarshal([]byte(drivers), &hp.Drivers); err != nil {
		return HardwareProfile{}, fmt.Errorf("decoding drivers of hardware profile %s: %w", hp.Name, err)
	}
	return hp, nil
}

func (t *Tx) HardwareProfile(ctx context.Context, name string) (HardwareProfile, error) {
	// SQLite's writer keeps the profiles it read until a statement changes the table.
	rc := t.rows()
	if v, ok := rc.memo(memoHardwareProfiles, name); ok {
		return v.(HardwareProfile).clone(), nil
	}
	hp, err := scanProfile(t.queryRow(ctx, `SELECT name, drivers, local_boot FROM hardware_profiles WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return HardwareProfile{}, fmt.Errorf("hardware profile %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return HardwareProfile{}, fmt.Errorf("reading hardware profile %q: %w", name, err)
	}
	rc.remember(memoHardwareProfiles, name, hp.clone())
	return hp, nil
}

// clone is hp with a map of its own.
func (hp HardwareProfile) clone() HardwareProfile {
	hp.Drivers = maps.Clone(hp.Drivers)
	return hp
}

func (s *Store) HardwareProfiles(ctx context.Context) ([]HardwareProfile, error) {
	rows, err := s.queryRows(ctx, `SELECT name, drivers, local_boot FROM hardware_profiles ORDER BY name`)
	return collect(rows, err, "hardware profiles", scanProfile)
}

// ---------------------------------------------------------------- secrets

func (t *Tx) InsertSecret(ctx context.Context, id, tenantID string, sealed []byte) error {
	if _, err := t.exec(ctx, `INSERT INTO secrets (id, tenant_id, sealed, created_at) VALUES (?, ?, ?, ?)`, id, tenantID, sealed, t.at); err != nil {
		return fmt.Errorf("storing sealed secret: %w", err)
	}
	return nil
}

func (t *Tx) DeleteSecret(ctx context.Context, id string) error {
	if _, err := t.exec(ctx, `DELETE FROM secrets WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting secret: %w", err)
	}
	return nil
}

// Sealed returns a sealed secret.
func (s *Store) Sealed(ctx context.Context, id string) ([]byte, error) {
	var b []byte
	err := s.queryRow(ctx, `SELECT sealed FROM secrets WHERE id = ?`, id).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("secret %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", id, err)
	}
	return b, nil
}

// ---------------------------------------------------------------- tokens

func (t *Tx) InsertToken(ctx context.Context, tok Token) (Token, error) {
	tok.ID = NewID(Micros(t.at))
	tok.CreatedAt = t.at
	if _, err := t.exec(ctx, `INSERT INTO api_tokens (id, name, hash, role, tenant_id, created_by, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		tok.ID, tok.Name, tok.Hash, tok.Role, tok.TenantID, tok.CreatedBy, tok.CreatedAt); err != nil {
		if isUnique(err) {
			return Token{}, fmt.Errorf("token %q: %w", tok.Name, ErrConflict)
		}
		return Token{}, fmt.Errorf("inserting token %q: %w", tok.Name, err)
	}
	return tok, nil
}

func (t *Tx) RevokeToken(ctx context.Context, ref string) (Token, error) {
	res, err := t.exec(ctx, `UPDATE api_tokens SET revoked_at = ? WHERE (id = ? OR name = ?) AND revoked_at = 0`, t.at, ref, ref)
	if err != nil {
		return Token{}, fmt.Errorf("revoking token: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Token{}, fmt.Errorf("active token %q: %w", ref, ErrNotFound)
	}
	tok, err := scanToken(t.queryRow(ctx, `SELECT `+tokenCols+` FROM api_tokens WHERE id = ? OR name = ?`, ref, ref))
	if err != nil {
		return Token{}, fmt.Errorf("reading revoked token %q: %w", ref, err)
	}
	return tok, nil
}

const tokenCols = `id, name, hash, role, tenant_id, created_by, created_at, revoked_at`

func scanToken(r interface{ Scan(...any) error }) (Token, error) {
	var tok Token
	err := r.Scan(&tok.ID, &tok.Name, &tok.Hash, &tok.Role, &tok.TenantID, &tok.CreatedBy, &tok.CreatedAt, &tok.RevokedAt)
	return tok, err
}

// TokenByHash finds an active token.
func (s *Store) TokenByHash(ctx context.Context, hash []byte) (Token, error) {
	tok, err := scanToken(s.queryRow(ctx, `SELECT `+tokenCols+` FROM api_tokens WHERE hash = ? AND revoked_at = 0`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, fmt.Errorf("token: %w", ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("reading token: %w", err)
	}
	return tok, nil
}

func (s *Store) Tokens(ctx context.Context) ([]Token, error) {
	rows, err := s.queryRows(ctx, `SELECT `+tokenCols+` FROM api_tokens ORDER BY created_at`)
	return collect(rows, err, "tokens", scanToken)
}

// CountTokens counts tokens ever created (first start detection).
func (t *Tx) CountTokens(ctx context.Context) (int, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM api_tokens`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting tokens: %w", err)
	}
	return n, nil
}

// CountTenants counts the tenants (first start detection).
func (t *Tx) CountTenants(ctx context.Context) (int, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM tenants`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting tenants: %w", err)
	}
	return n, nil
}

// LockInstallation holds the installation-wide lock until the transaction ends: servers that
// start at once on one PostgreSQL database take their first-start decisions one after the
// other. SQLite's single writer already runs one transaction at a time.
func (t *Tx) LockInstallation(ctx context.Context) error {
	if t.s.engine != Postgres {
		return nil
	}
	if _, err := t.exec(ctx, `SELECT pg_advisory_xact_lock(?)`, t.s.installLock); err != nil {
		return fmt.Errorf("taking the installation lock: %w", err)
	}
	return nil
}

// ---------------------------------------------------------------- events and wake-ups

// AppendEvent adds an event row in the transaction.
func (t *Tx) AppendEvent(ctx context.Context, e Event) error {
	if t.lc != nil {
		t.holdEvents(e)
		return nil
	}
	if e.Data == "" {
		e.Data = "{}"
	}
	return t.execLater(ctx, "appending event "+e.Kind, `INSERT INTO events (at, tenant_id, node_id, actor, kind, from_state, to_state, reason, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.at, e.TenantID, e.NodeID, e.Actor, e.Kind, e.FromState, e.ToState, e.Reason, e.Data)
}

// Wake queues the node's reconciler (one row per node; a newer wake-up keeps the earliest due
// time).
func (t *Tx) Wake(ctx context.Context, nodeID, reason string, due time.Duration) error {
	dueAt := t.at + due.Microseconds()
	return t.execLater(ctx, "queueing reconciler of node "+nodeID, `INSERT INTO reconcile_queue (node_id, due_at, reason, enqueued_at, seq) VALUES (?, ?, ?, ?, 1)
		ON CONFLICT (node_id) DO UPDATE SET due_at = CASE WHEN excluded.due_at < reconcile_queue.due_at THEN excluded.due_at ELSE reconcile_queue.due_at END,
		reason = excluded.reason, enqueued_at = excluded.enqueued_at, seq = reconcile_queue.seq + 1`, nodeID, dueAt, reason, t.at)
}

// WakeUps lists the reconciler wake-up rows, earliest due first.
func (s *Store) WakeUps(ctx context.Context, limit int) ([]WakeUp, error) {
	rows, err := s.queryRows(ctx, `SELECT node_id, due_at, reason, enqueued_at, attempts FROM reconcile_queue ORDER BY due_at, node_id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("listing wake-ups: %w", err)
	}
	defer rows.Close()
	var out []WakeUp
	for rows.Next() {
		var w WakeUp
		if err := rows.Scan(&w.NodeID, &w.DueAt, &w.Reason, &w.EnqueuedAt, &w.Attempts); err != nil {
			return nil, fmt.Errorf("reading wake-up: %w", err)
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// EventFilter selects events.
type EventFilter struct {
	NodeID   string
	TenantID string
	AfterID  uint64
	Limit    int
	// Kinds keeps the events of these kinds only, each exact ("node.fail") or every kind
	// under a prefix ("node.*"): see EventKindPattern.
	Kinds []string
	// Newest: the last Limit events before BeforeID (0: the newest there are), oldest first,
	// instead of the first Limit after AfterID (ignored).
	Newest   bool
	BeforeID uint64
}

// eventCols are the columns scanEvent reads.
const eventCols = `id, at, tenant_id, node_id, actor, kind, from_state, to_state, reason, data`

// scanEvent reads a row of eventCols, and into extra the columns selected after them.
func scanEvent(r interface{ Scan(...any) error }, extra ...any) (Event, error) {
	var e Event
	var id int64
	err := r.Scan(append([]any{&id, &e.At, &e.TenantID, &e.NodeID, &e.Actor, &e.Kind, &e.FromState, &e.ToState, &e.Reason, &e.Data}, extra...)...)
	e.ID = uint64(id)
	return e, err
}

// Events lists the events f selects in id order. Filtered by kind or tenant over every node,
// it reads the log in windows of eventScanWindow ids (short statements: no read holds a
// snapshot for the whole log), until it has f.Limit events or reached the end.
func (s *Store) Events(ctx context.Context, f EventFilter) ([]Event, error) {
	if f.Newest {
		upTo := uint64(math.MaxInt64)
		if f.BeforeID > 0 {
			upTo = f.BeforeID - 1
		}
		return s.newestEvents(ctx, f, upTo, "", nil)
	}
	if !f.windowed() {
		return s.eventRows(ctx, f, "", nil, "id")
	}
	top, err := s.topEventID(ctx)
	if err != nil {
		return nil, err
	}
	evs, _, err := s.eventsUpTo(ctx, f, top)
	return evs, err
}

// windowed reports whether f's events are read in windows of ids: filtered by kind or
// tenant over every node (a tenant's events may be few among many). A node's events are read
// through events_node, and without a filter every event is one the listing wants: either
// way each row read is one answered.
func (f EventFilter) windowed() bool { return (len(f.Kinds) > 0 || f.TenantID != "") && f.NodeID == "" }

// eventScanWindow is how many ids a statement of a windowed listing reads at most.
const eventScanWindow = 50_000

// scanWindow is s.eventWindow, or eventScanWindow.
func (s *Store) scanWindow() uint64 { return uint64(cmp.Or(s.eventWindow, eventScanWindow)) }

// topEventID is the largest event id (0: none).
func (s *Store) topEventID(ctx context.Context) (uint64, error) {
	var top int64
	if err := s.queryRow(ctx, `SELECT COALESCE(MAX(id), 0) FROM events`).Scan(&top); err != nil {
		return 0, fmt.Errorf("reading the newest event id: %w", err)
	}
	return uint64(top), nil
}

// eventsUpTo lists f's events after f.AfterID up to id top, window by window, and returns the
// id up to which it looked: top, or the last event's when it stopped at f.Limit.
func (s *Store) eventsUpTo(ctx context.Context, f EventFilter, top uint64) ([]Event, uint64, error) {
	var out []Event
	lo := f.AfterID
	for lo < top && len(out) < f.Limit {
		hi := min(lo+s.scanWindow(), top)
		g := f
		g.Limit = f.Limit - len(out)
		evs, err := s.eventRows(ctx, g, ` AND id > ? AND id <= ?`, []any{int64(lo), int64(hi)}, "id")
		if err != nil {
			return nil, 0, err
		}
		out = append(out, evs...)
		lo = hi
	}
	if len(out) == f.Limit && f.Limit > 0 {
		return out, out[len(out)-1].ID, nil
	}
	return out, max(lo, f.AfterID), nil
}

// newestEvents lists the last f.Limit of f's events with ids up to upTo (and the extra
// condition where, with args), oldest first; by kind over every node, window by window
// downwards.
func (s *Store) newestEvents(ctx context.Context, f EventFilter, upTo uint64, where string, args []any) ([]Event, error) {
	if upTo > math.MaxInt64 {
		upTo = math.MaxInt64
	}
	var out []Event
	if !f.windowed() {
		evs, err := s.eventRows(ctx, f, where+` AND id <= ?`, append(slices.Clone(args), int64(upTo)), "id DESC")
		if err != nil {
			return nil, err
		}
		out = evs
	} else {
		top, err := s.topEventID(ctx)
		if err != nil {
			return nil, err
		}
		hi := min(upTo, top)
		for hi > 0 && len(out) < f.Limit {
			lo := hi - min(hi, s.scanWindow())
			g := f
			g.Limit = f.Limit - len(out)
			evs, err := s.eventRows(ctx, g, where+` AND id > ? AND id <= ?`, append(slices.Clone(args), int64(lo), int64(hi)), "id DESC")
			if err != nil {
				return nil, err
			}
			out = append(out, evs...)
			hi = lo
		}
	}
	slices.Reverse(out)
	return out, nil
}

// eventRows runs eventsQuery: f's events with the extra condition where (its arguments
// args), in the order given.
func (s *Store) eventRows(ctx context.Context, f EventFilter, where string, args []any, order string) ([]Event, error) {
	q, all := eventsQuery(f, where, args, order)
	rows, err := s.queryRows(ctx, q, all...)
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("reading event: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// eventsQuery is the query of f's node, tenant and kinds, with the extra condition where (its
// arguments args), in the order given, at most f.Limit rows; after f.AfterID unless f.Newest.
func eventsQuery(f EventFilter, where string, args []any, order string) (string, []any) {
	fw, fargs := eventFilterWhere(f)
	q := `SELECT ` + eventCols + ` FROM events WHERE `
	var all []any
	if f.Newest {
		q += `TRUE`
	} else {
		q += `id > ?`
		all = append(all, int64(f.AfterID))
	}
	all = append(append(append(all, fargs...), args...), f.Limit)
	return q + fw + where + ` ORDER BY ` + order + ` LIMIT ?`, all
}

// eventFilterWhere is f's node, tenant and kind conditions, each only when set: a condition
// that holds for an empty filter as well ("? = ” OR node_id = ?") keeps both engines from
// reading a node's events through events_node, and a node's listing would read the whole
// events table (SQLite always; PostgreSQL once it plans the statement generically).
func eventFilterWhere(f EventFilter) (string, []any) {
	var where string
	var args []any
	if f.NodeID != "" {
		where += ` AND node_id = ?`
		args = append(args, f.NodeID)
	}
	if f.TenantID != "" {
		where += ` AND tenant_id = ?`
		args = append(args, f.TenantID)
	}
	if len(f.Kinds) > 0 {
		kw, kargs := kindsWhere(f.Kinds)
		where += ` AND ` + kw
		args = append(args, kargs...)
	}
	return where, args
}

// kindsWhere is the condition of kind patterns (EventKindPattern): exact kinds compared
// equal, prefixes ("node.*") by the kind's first characters (equality: no collation of
// either engine reorders it, and no LIKE wildcard or case folding to escape).
func kindsWhere(kinds []string) (string, []any) {
	var terms []string
	var args []any
	for _, k := range kinds {
		if prefix, ok := strings.CutSuffix(k, "*"); ok {
			terms = append(terms, `substr(kind, 1, `+strconv.Itoa(len(prefix))+`) = ?`)
			args = append(args, prefix)
		} else {
			terms = append(terms, `kind = ?`)
			args = append(args, k)
		}
	}
	return `(` + strings.Join(terms, ` OR `) + `)`, args
}

// EventKindPattern checks one kind filter: a kind ("node.fail", "workflow.step") or a prefix
// of kinds ending in ".*" ("node.*", "node.hardware.*"); a kind is lowercase letters, digits and
// '_' in parts joined by '.'. Pure.
func EventKindPattern(k string) error {
	body := strings.TrimSuffix(k, ".*")
	if body == "" {
		return fmt.Errorf("%q is not an event kind: a kind such as node.fail, or a prefix such as node.* (every kind under node.)", k)
	}
	for _, part := range strings.Split(body, ".") {
		if part == "" || strings.IndexFunc(part, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
		}) >= 0 {
			return fmt.Errorf("%q is not an event kind: a kind is lowercase letters, digits and _ in parts joined by dots (node.fail), a prefix ends in .* (node.*)", k)
		}
	}
	return nil
}

// eventsSinceQuery is the query of EventsSince on PostgreSQL after the cursor (xid, id), with
// its arguments, up to the cursor (xid, id) upTo when upTo is set (else up to the oldest
// transaction still running).
func eventsSinceQuery(f EventFilter, xid string, id int64, upTo *pgCursor) (string, []any) {
	where, args := eventFilterWhere(f)
	bound, bargs := `xid < pg_snapshot_xmin(pg_current_snapshot())`, []any(nil)
	if upTo != nil {
		bound, bargs = `(xid, id) <= (?::xid8, ?)`, []any{upTo.xid, upTo.id}
	}
	// ORDER BY names the table's xid: a bare xid is the selected xid::text, whose order is not
	// the transactions' ("100" before "99"), and a page would end on a cursor past events it
	// left out.
	return `SELECT ` + eventCols + `, xid::text FROM events
		WHERE (xid, id) > (?::xid8, ?) AND ` + bound + where + ` ORDER BY events.xid, events.id LIMIT ?`,
		append(append(append([]any{xid, id}, bargs...), args...), f.Limit)
}

// pgCursor is a position in PostgreSQL's commit order of events: (transaction, id).
type pgCursor struct {
	xid string
	id  int64
}

func (c pgCursor) String() string { return c.xid + ":" + strconv.FormatInt(c.id, 10) }

// EventsSince returns the events committed after those cursor covers ("": from the start, or
// with f.Newest the last f.Limit events there are now), in commit order, and the cursor that
// covers them. On PostgreSQL ids are taken before commit, so a transaction may commit a lower
// id after a higher one: a follower reading by id would pass over it. Here events are read by
// (transaction, id) up to the oldest transaction still running, whose events are left for a
// later call. SQLite's one writer commits in id order: the cursor is the last id. Filtered by
// kind or tenant over every node, the log is read in windows (Events), and the cursor covers
// what was looked at, whether or not an event in it was selected: a follower of rare kinds
// never reads the same stretch again.
func (s *Store) EventsSince(ctx context.Context, f EventFilter, cursor string) ([]Event, string, error) {
	if s.engine != Postgres {
		after := uint64(0)
		if cursor != "" {
			var err error
			if after, err = strconv.ParseUint(cursor, 10, 64); err != nil || after > math.MaxInt64 {
				return nil, "", fmt.Errorf("event cursor %q: %w: pass the cursor of an earlier answer, or none", cursor, ErrBadCursor)
			}
		}
		if f.Newest && cursor == "" {
			// Ids are taken in commit order: every event up to top is committed.
			top, err := s.topEventID(ctx)
			if err != nil {
				return nil, "", err
			}
			evs, err := s.newestEvents(ctx, f, top, "", nil)
			return evs, strconv.FormatUint(top, 10), err
		}
		f.Newest, f.AfterID = false, after
		if f.windowed() {
			top, err := s.topEventID(ctx)
			if err != nil {
				return nil, "", err
			}
			evs, to, err := s.eventsUpTo(ctx, f, top)
			if err != nil {
				return nil, "", err
			}
			return evs, strconv.FormatUint(to, 10), nil
		}
		evs, err := s.Events(ctx, f)
		if len(evs) > 0 {
			cursor = strconv.FormatUint(evs[len(evs)-1].ID, 10)
		}
		return evs, cursor, err
	}
	at := pgCursor{xid: "0"}
	if cursor != "" {
		x, i, ok := strings.Cut(cursor, ":")
		n, err := strconv.ParseInt(i, 10, 64)
		if _, xerr := strconv.ParseUint(x, 10, 64); !ok || err != nil || xerr != nil {
			return nil, "", fmt.Errorf("event cursor %q: %w: pass the cursor of an earlier answer, or none", cursor, ErrBadCursor)
		}
		at = pgCursor{xid: x, id: n}
	}
	if f.Newest && cursor == "" {
		end, ok, err := s.pgLastVisible(ctx, at)
		if err != nil || !ok {
			return nil, "", err // nothing committed yet: a follower starts from the start
		}
		evs, err := s.newestEvents(ctx, f, math.MaxInt64, ` AND (xid, id) <= (?::xid8, ?)`, []any{end.xid, end.id})
		return evs, end.String(), err
	}
	f.Newest = false
	if !f.windowed() {
		evs, next, err := s.pgEventsSince(ctx, f, at, nil)
		if next == nil {
			return evs, cursor, err
		}
		return evs, next.String(), err
	}
	var out []Event
	for len(out) < f.Limit {
		// The window: the next eventScanWindow committed events, or those there are.
		end, ok, err := s.pgWindowEnd(ctx, at)
		if err != nil {
			return nil, "", err
		}
		last := false
		if !ok {
			if end, ok, err = s.pgLastVisible(ctx, at); err != nil || !ok {
				break // nothing committed after the cursor
			}
			last = true
		}
		g := f
		g.Limit = f.Limit - len(out)
		evs, next, err := s.pgEventsSince(ctx, g, at, &end)
		if err != nil {
			return nil, "", err
		}
		out = append(out, evs...)
		if len(out) == f.Limit {
			at = *next
			break
		}
		at = end
		if last {
			break
		}
	}
	if at.xid == "0" && at.id == 0 {
		return out, cursor, nil
	}
	return out, at.String(), nil
}

// pgEventsSince reads f's events after the cursor at in commit order, up to upTo (nil: the
// oldest transaction still running), and returns the cursor of the last one (nil: none).
func (s *Store) pgEventsSince(ctx context.Context, f EventFilter, at pgCursor, upTo *pgCursor) ([]Event, *pgCursor, error) {
	q, args := eventsSinceQuery(f, at.xid, at.id, upTo)
	rows, err := s.queryRows(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("listing events since %s: %w", at, err)
	}
	defer rows.Close()
	var out []Event
	var last *pgCursor
	for rows.Next() {
		var xid string
		e, err := scanEvent(rows, &xid)
		if err != nil {
			return nil, nil, fmt.Errorf("reading event: %w", err)
		}
		out = append(out, e)
		last = &pgCursor{xid: xid, id: int64(e.ID)}
	}
	return out, last, rows.Err()
}

// pgWindowEnd is the cursor of the eventScanWindow-th event committed after at (false: fewer
// are).
func (s *Store) pgWindowEnd(ctx context.Context, at pgCursor) (pgCursor, bool, error) {
	return s.pgCursorAt(ctx, `SELECT xid::text, id FROM events WHERE (xid, id) > (?::xid8, ?)
		AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY events.xid, events.id OFFSET `+strconv.FormatUint(s.scanWindow()-1, 10)+` LIMIT 1`, at)
}

// pgLastVisible is the cursor of the last event committed after at, in commit order, of the
// transactions older than every one still running (false: none).
func (s *Store) pgLastVisible(ctx context.Context, at pgCursor) (pgCursor, bool, error) {
	return s.pgCursorAt(ctx, `SELECT xid::text, id FROM events WHERE (xid, id) > (?::xid8, ?)
		AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY events.xid DESC, events.id DESC LIMIT 1`, at)
}

func (s *Store) pgCursorAt(ctx context.Context, q string, at pgCursor) (pgCursor, bool, error) {
	var c pgCursor
	switch err := s.queryRow(ctx, q, at.xid, at.id).Scan(&c.xid, &c.id); {
	case errors.Is(err, sql.ErrNoRows):
		return pgCursor{}, false, nil
	case err != nil:
		return pgCursor{}, false, fmt.Errorf("reading the event log's position after %s: %w", at, err)
	}
	return c, true, nil
}

// ErrBadCursor is an event cursor that no answer gave.
var ErrBadCursor = errors.New("not an event cursor")

// Dump returns every row of every table as text (tests grep it for secrets, and compare two
// dumps). Each table's rows are in the order of their text: neither engine keeps rows in any
// order without ORDER BY (PostgreSQL moves a row that an UPDATE rewrote, even with the values it
// had), and two dumps of the same rows must be the same text.
func (s *Store) Dump(ctx context.Context) (string, error) {
	var b strings.Builder
	for _, table := range []string{"tenants", "sites", "hardware_profiles", "pools", "secrets", "nodes", "node_macs", "node_labels", "events", "reconcile_queue", "commands", "api_tokens", "workflows", "workflow_plans", "agents", "node_inventory",
		"join_tokens", "deploy_profiles", "signers", "images", "discovered", "mac_candidates"} {
		lines, err := s.dumpTable(ctx, table)
		if err != nil {
			return "", err
		}
		slices.Sort(lines)
		for _, l := range lines {
			b.WriteString(l)
		}
	}
	return b.String(), nil
}

// dumpTable returns the rows of table as Dump writes them, one line each.
func (s *Store) dumpTable(ctx context.Context, table string) ([]string, error) {
	rows, err := s.queryRows(ctx, `SELECT * FROM `+table)
	if err != nil {
		return nil, fmt.Errorf("dumping %s: %w", table, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("dumping %s: %w", table, err)
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var lines []string
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("dumping %s: %w", table, err)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s:", table)
		for _, v := range vals {
			if bs, ok := v.([]byte); ok {
				fmt.Fprintf(&b, " %s", bs)
			} else {
				fmt.Fprintf(&b, " %v", v)
			}
		}
		b.WriteByte('\n')
		lines = append(lines, b.String())
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("dumping %s: %w", table, err)
	}
	return lines, nil
}

// BMCRef is a node's BMC binding as commands carry it: credentials by reference only.
type BMCRef struct {
	Driver            string `json:"driver"`
	Address           string `json:"address"`
	UsernameRef       string `json:"usernameRef"`
	PasswordRef       string `json:"passwordRef"`
	InsecureTLS       bool   `json:"insecureTls,omitempty"`
	FingerprintSHA256 string `json:"fingerprintSha256,omitempty"`
}

// BMC returns the node's BMC binding.
func (n Node) BMC() BMCRef {
	return BMCRef{Driver: n.BMCDriver, Address: n.BMCAddress, UsernameRef: n.BMCUsernameRef, PasswordRef: n.BMCPasswordRef,
		InsecureTLS: n.BMCInsecure, FingerprintSHA256: n.BMCFingerprint}
}
