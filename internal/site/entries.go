package site

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"bcd/internal/dhcp"
	"bcd/internal/durable"
	"bcd/internal/netboot"
)

// EntriesFile is the boot-entry table's file in the data dir.
const EntriesFile = "boot-entries.json"

// maxLearnedAddrs bounds the address ↔ MAC table the metadata endpoint and the boot binding
// use.
const maxLearnedAddrs = 65536

// bootRecord is one MAC's entry and the node it belongs to.
type bootRecord struct {
	NodeID string        `json:"nodeId"`
	Entry  netboot.Entry `json:"entry"`
}

// instanceRecord is what the metadata endpoint answers for a deployed node.
type instanceRecord struct {
	Token string   `json:"instanceToken"`
	MACs  []string `json:"macs"`
	// UserDataSHA256 is the hex SHA-256 of the operator user-data the node's deploy gave, ""
	// when none. The user-data itself is never written to the table's file (Entries.userData).
	UserDataSHA256 string `json:"userDataSha256,omitempty"`
}

// tableFile is the on-disk form of the table.
type tableFile struct {
	Entries   map[string]bootRecord     `json:"entries"`   // MAC (lower case) → record
	Instances map[string]instanceRecord `json:"instances"` // node → instance token
}

// Entries is the site agent's boot-entry table: one entry per MAC, installed by boot.*
// commands, persisted (JSON, replaced atomically) so that a restarted agent serves them again.
// It also keeps each deployed node's instance token for the metadata endpoint, and learns which
// address a MAC booted from. Safe for concurrent use.
type Entries struct {
	path    string // "" keeps everything in memory
	gateway string // what /metadata names as the gateway
	ca      string // what /metadata names as the CA to trust (PEM)
	// caNow, when set, is read instead of ca at every answer (FollowCA).
	caNow func() []byte

	now func() time.Time

	mu sync.Mutex
	t  tableFile
	// userData is the operator user-data of nodes, by node, in memory only: the table's file
	// keeps its digest alone (instanceRecord.UserDataSHA256). A restarted agent holds none
	// until the control plane pushes the entries again (a full push re-sends each, encrypted
	// to this agent); meanwhile the guest endpoints answer 503 for such nodes.
	userData map[string][]byte
	addrs    *addrBook // which address each MAC holds: learned from DHCP, or from script requests
	gen      uint64    // bumped on every change (status reports)
}

// OpenEntries loads the table from dir (created if needed); dir "" keeps it in memory.
// gatewayURL and caPEM are the gateway as machines reach it and the CA that certifies it, which
// /metadata tells an installed OS.
func OpenEntries(dir, gatewayURL string, caPEM []byte) (*Entries, error) {
	e := &Entries{gateway: gatewayURL, ca: string(caPEM), addrs: newAddrBook(maxLearnedAddrs), now: time.Now, userData: map[string][]byte{},
		t: tableFile{Entries: map[string]bootRecord{}, Instances: map[string]instanceRecord{}}}
	if dir == "" {
		return e, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening boot entries: creating %s: %w", dir, err)
	}
	e.path = filepath.Join(dir, EntriesFile)
	b, err := os.ReadFile(e.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return e, nil
	case err != nil:
		return nil, fmt.Errorf("opening boot entries: %w", err)
	}
	var t tableFile
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("opening boot entries: %s is not valid JSON: %w", e.path, err)
	}
	if t.Entries != nil {
		e.t.Entries = t.Entries
	}
	if t.Instances != nil {
		e.t.Instances = t.Instances
	}
	return e, nil
}

// Entry implements netboot.EntryLookup.
func (e *Entries) Entry(_ context.Context, mac net.HardwareAddr) (netboot.Entry, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.t.Entries[mac.String()]
	return r.Entry, ok
}

// KindOf returns the kind of node's entry ("" when it has none).
func (e *Entries) KindOf(nodeID string) netboot.Kind {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.t.Entries {
		if r.NodeID == nodeID {
			return r.Entry.Kind
		}
	}
	return ""
}

// RemoveKind deletes node's entries of kind (its instance token stays).
func (e *Entries) RemoveKind(nodeID string, kind netboot.Kind) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := cloneTable(e.t)
	for m, r := range e.t.Entries {
		if r.NodeID == nodeID && r.Entry.Kind == kind {
			delete(e.t.Entries, m)
		}
	}
	return e.commitLocked(old, "removing "+string(kind)+" entries of node "+nodeID)
}

// Has reports whether mac has an entry.
func (e *Entries) Has(mac string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.t.Entries[mac]
	return ok
}

// Needs reports whether an entry boots the artifact with this digest.
func (e *Entries) Needs(sha string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.t.Entries {
		for _, a := range r.Entry.Artifacts() {
			if a.SHA256 == sha {
				return true
			}
		}
	}
	return false
}

// AddDigests adds the digests of the artifacts the entries boot to set.
func (e *Entries) AddDigests(set map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.t.Entries {
		for _, a := range r.Entry.Artifacts() {
			set[a.SHA256] = true
		}
	}
}

// Install sets the entry of every MAC of node and saves the table. MACs are canonical
// (ParseMACs). A MAC that belonged to another node moves to this one.
func (e *Entries) Install(nodeID string, macs []string, entry netboot.Entry) error {
	if err := entry.Validate(); err != nil {
		return fmt.Errorf("installing boot entry of node %s: %w", nodeID, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := cloneTable(e.t)
	for _, m := range macs {
		e.t.Entries[m] = bootRecord{NodeID: nodeID, Entry: entry}
	}
	return e.commitLocked(old, "installing boot entry of node "+nodeID)
}

// SetInstance keeps node's instance token for the metadata endpoint, and the operator
// user-data of its deploy (nil: none) for the guest endpoints, in memory only.
func (e *Entries) SetInstance(nodeID string, macs []string, token string, userData []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := cloneTable(e.t)
	e.t.Instances[nodeID] = instanceRecord{Token: token, MACs: slices.Clone(macs), UserDataSHA256: userDataDigest(userData)}
	if err := e.commitLocked(old, "keeping instance token of node "+nodeID); err != nil {
		return err
	}
	e.setUserDataLocked(nodeID, userData)
	return nil
}

// setUserDataLocked keeps (or, nil, drops) node's user-data in memory.
func (e *Entries) setUserDataLocked(nodeID string, b []byte) {
	if b == nil {
		delete(e.userData, nodeID)
		return
	}
	e.userData[nodeID] = slices.Clone(b)
}

// userDataDigest is the hex SHA-256 of b, "" for nil. Pure.
func userDataDigest(b []byte) string {
	if b == nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// UserData implements netboot.UserDataLookup: the node's user-data, nil when its deploy gave
// none; netboot.ErrUserDataUnavailable when it gave some this agent does not hold (restarted
// since, in memory only).
func (e *Entries) UserData(_ context.Context, nodeID string) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	in, ok := e.t.Instances[nodeID]
	if !ok || in.UserDataSHA256 == "" {
		return nil, nil
	}
	b, ok := e.userData[nodeID]
	if !ok || userDataDigest(b) != in.UserDataSHA256 {
		return nil, netboot.ErrUserDataUnavailable
	}
	return slices.Clone(b), nil
}

// Remove deletes node's entries: those of macs and any other that names the node, and its
// instance token.
func (e *Entries) Remove(nodeID string, macs []string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := cloneTable(e.t)
	for _, m := range macs {
		if r, ok := e.t.Entries[m]; ok && r.NodeID == nodeID {
			delete(e.t.Entries, m)
		}
	}
	for m, r := range e.t.Entries {
		if r.NodeID == nodeID {
			delete(e.t.Entries, m)
		}
	}
	delete(e.t.Instances, nodeID)
	if err := e.commitLocked(old, "removing boot entries of node "+nodeID); err != nil {
		return err
	}
	delete(e.userData, nodeID)
	return nil
}

// Learn records that mac booted from addr (boot binding none: the metadata endpoint answers by
// the address a MAC's script was fetched from).
func (e *Entries) Learn(addr netip.Addr, mac string) {
	if !addr.IsValid() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.addrs.bind(mac, addr, time.Time{})
}

// Observe records an address the site's DHCP saw a MAC take or give back (boot binding lease;
// dhcp.Config.Observe).
func (e *Entries) Observe(b dhcp.Binding) {
	if !b.IP.IsValid() || len(b.MAC) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if b.Released {
		e.addrs.unbind(b.MAC.String(), b.IP)
		return
	}
	e.addrs.bind(b.MAC.String(), b.IP, b.Expires)
}

// BootsFrom implements netboot.BindingLookup: addr is the address mac holds, or one another MAC
// of the same node holds (a machine that booted from another NIC than the one its script
// request names: iPXE names net0).
func (e *Entries) BootsFrom(mac net.HardwareAddr, addr netip.Addr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	held, ok := e.addrs.macAt(addr, e.now())
	if !ok {
		return false
	}
	if held == mac.String() {
		return true
	}
	a, okA := e.t.Entries[mac.String()]
	b, okB := e.t.Entries[held]
	return okA && okB && a.NodeID != "" && a.NodeID == b.NodeID
}

// metadataDoc is what /metadata answers a deployed node: enough for its installed OS to join
// the gateway as the node (docs/lab-os-image.md).
type metadataDoc struct {
	NodeID        string `json:"nodeId"`
	Gateway       string `json:"gateway"`
	InstanceToken string `json:"instanceToken"`
	CA            string `json:"ca,omitempty"` // PEM of the CA that certifies the gateway
}

// Metadata implements netboot.MetadataLookup: the node whose MAC booted from addr, if it has an
// instance token.
func (e *Entries) Metadata(_ context.Context, addr netip.Addr) ([]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	mac, ok := e.addrs.macAt(addr, e.now())
	if !ok {
		return nil, false
	}
	for node, in := range e.t.Instances {
		if slices.Contains(in.MACs, mac) {
			ca := e.ca
			if e.caNow != nil {
				if b := e.caNow(); len(b) > 0 {
					ca = string(b)
				}
			}
			b, err := json.Marshal(metadataDoc{NodeID: node, Gateway: e.gateway, InstanceToken: in.Token, CA: ca})
			return b, err == nil
		}
	}
	return nil, false
}

// FollowCA makes /metadata name the CA bundle f returns at each answer (the agent's, which
// follows a rotation of the agent CA) rather than the one given to OpenEntries.
func (e *Entries) FollowCA(f func() []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.caNow = f
}

// Generation changes whenever the table does.
func (e *Entries) Generation() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// Len is the number of MACs with an entry.
func (e *Entries) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.t.Entries)
}

// commitLocked saves the table; on failure it puts old back so memory never claims what the
// disk does not hold.
func (e *Entries) commitLocked(old tableFile, what string) error {
	if err := e.saveLocked(); err != nil {
		e.t = old
		return fmt.Errorf("%s: %w", what, err)
	}
	e.gen++
	return nil
}

func (e *Entries) saveLocked() error {
	if e.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(e.t, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the table: %w", err)
	}
	return durable.WriteFile(e.path, b, 0o600)
}

func cloneTable(t tableFile) tableFile {
	c := tableFile{Entries: make(map[string]bootRecord, len(t.Entries)), Instances: make(map[string]instanceRecord, len(t.Instances))}
	for k, v := range t.Entries {
		c.Entries[k] = v
	}
	for k, v := range t.Instances {
		c.Instances[k] = v
	}
	return c
}
