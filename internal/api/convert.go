package api

import (
	"context"
	"sync"
	"time"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

func ts(us int64) string {
	if us == 0 {
		return ""
	}
	return store.Micros(us).Format(time.RFC3339Nano)
}

// names resolves tenant, site and pool ids to names for responses.
type names struct {
	tenants, sites, pools map[string]string
}

// has reports whether every id is known.
func (n names) has(tenantID, siteID, poolID string) bool {
	_, t := n.tenants[tenantID]
	_, s := n.sites[siteID]
	_, p := n.pools[poolID]
	return (tenantID == "" || t) && (siteID == "" || s) && (poolID == "" || p)
}

// nameCache keeps the names of the (small) tenant, site and pool tables; it reloads them when
// asked for an id it does not know, and after maxAge (names never change, rows come and go).
type nameCache struct {
	st     *store.Store
	maxAge time.Duration
	mu     sync.Mutex
	cur    names
	loaded time.Time
}

func (c *nameCache) get(ctx context.Context, tenantID, siteID, poolID string) (names, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur.tenants != nil && time.Since(c.loaded) < c.maxAge && c.cur.has(tenantID, siteID, poolID) {
		return c.cur, nil
	}
	n, err := loadNames(ctx, c.st)
	if err != nil {
		return names{}, err
	}
	c.cur, c.loaded = n, time.Now()
	return n, nil
}

func loadNames(ctx context.Context, st *store.Store) (names, error) {
	n := names{tenants: map[string]string{}, sites: map[string]string{}, pools: map[string]string{}}
	ts, err := st.Tenants(ctx)
	if err != nil {
		return n, err
	}
	for _, t := range ts {
		n.tenants[t.ID] = t.Name
	}
	ss, err := st.Sites(ctx, "")
	if err != nil {
		return n, err
	}
	for _, s := range ss {
		n.sites[s.ID] = s.Name
	}
	ps, err := st.Pools(ctx, "", "")
	if err != nil {
		return n, err
	}
	for _, p := range ps {
		n.pools[p.ID] = p.Name
	}
	return n, nil
}

// bmcInput is the BMC binding of an enroll or accept request (nil: none given).
func bmcInput(b *bcdv1.BmcCredentials) metal.BMCInput {
	if b == nil {
		return metal.BMCInput{}
	}
	return metal.BMCInput{Driver: b.Driver, Address: b.Address, Username: b.Username, Password: b.Password, InsecureTLS: b.InsecureTls, FingerprintSHA256: b.TlsFingerprintSha256, Inband: b.Inband}
}

func nodeProto(n store.Node, nm names) *bcdv1.Node {
	allowed := []string{}
	for _, v := range provision.Accepted(metal.PNode(n)) {
		allowed = append(allowed, string(v))
	}
	return &bcdv1.Node{
		Id: n.ID, Name: n.Name, Tenant: nm.tenants[n.TenantID], Site: nm.sites[n.SiteID], Pool: nm.pools[n.PoolID],
		State: n.State, TargetState: n.TargetState, FailedFrom: n.FailedFrom, FaultCode: n.FaultCode, FaultMessage: n.FaultMsg,
		Maintenance: n.Maintenance, MaintenanceReason: n.MaintenanceReason, Power: n.Power,
		HardwareProfile: n.HardwareProfile, Drivers: n.Drivers,
		Bmc: &bcdv1.BmcBinding{Driver: n.BMCDriver, Address: n.BMCAddress, UsernameRef: n.BMCUsernameRef, PasswordRef: n.BMCPasswordRef,
			InsecureTls: n.BMCInsecure, TlsFingerprintSha256: n.BMCFingerprint},
		Macs: n.MACs, ProductUuid: n.ProductUUID, Labels: n.Labels, DeployProfile: n.DeployProfile, DeployImage: n.DeployImage,
		WipeMode: n.WipeMode, IdentityGeneration: n.IdentityGeneration, AllowedVerbs: allowed,
		CreatedAt: ts(n.CreatedAt), UpdatedAt: ts(n.UpdatedAt), Version: n.Version, BatchId: n.BatchID, Conditions: n.Conditions,
		BootMode: n.BootMode, UserDataSize: n.UserDataSize, UserDataSha256: n.UserDataSHA256,
	}
}

func eventProto(e store.Event, nm names) *bcdv1.Event {
	return &bcdv1.Event{Id: e.ID, At: ts(e.At), Tenant: nm.tenants[e.TenantID], Node: e.NodeID, Actor: e.Actor, Kind: e.Kind,
		FromState: e.FromState, ToState: e.ToState, Reason: e.Reason, Data: e.Data}
}

func tokenProto(t store.Token, nm names) *bcdv1.Token {
	return &bcdv1.Token{Id: t.ID, Name: t.Name, Role: t.Role, Tenant: nm.tenants[t.TenantID], CreatedAt: ts(t.CreatedAt), RevokedAt: ts(t.RevokedAt)}
}

func policyFromProto(p *bcdv1.PoolPolicy) store.PoolPolicy {
	if p == nil {
		return store.PoolPolicy{}
	}
	return store.PoolPolicy{HardwareProfile: p.HardwareProfile, TrustProvisioningNetwork: p.TrustProvisioningNetwork, Labels: p.Labels, FirmwareBaseline: p.FirmwareBaseline, AutoAccept: p.AutoAccept, AutoAcceptInband: p.AutoAcceptInband, FastTrackWindow: p.FastTrackWindow,
		BIOSSettings: p.BiosSettings, FirmwareImages: p.FirmwareImages, HardwareRequirements: p.HardwareRequirements}
}

func policyProto(p store.PoolPolicy) *bcdv1.PoolPolicy {
	return &bcdv1.PoolPolicy{HardwareProfile: p.HardwareProfile, TrustProvisioningNetwork: p.TrustProvisioningNetwork, Labels: p.Labels, FirmwareBaseline: p.FirmwareBaseline, AutoAccept: p.AutoAccept, AutoAcceptInband: p.AutoAcceptInband, FastTrackWindow: p.FastTrackWindow,
		BiosSettings: p.BIOSSettings, FirmwareImages: p.FirmwareImages, HardwareRequirements: p.HardwareRequirements}
}
