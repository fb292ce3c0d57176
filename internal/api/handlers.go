package api

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/console"
	"bcd/internal/engine"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/hardware"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/readable"
	"bcd/internal/store"
)

type nodes struct {
	svc      *metal.Service
	verifier ResultVerifier // nil: attestations are listed unverified
	consoles *console.Hub   // nil: no consoles
	log      *slog.Logger
	names    *nameCache
}

func (h *nodes) respond(ctx context.Context, n store.Node, err error) (*connect.Response[bcdv1.NodeResponse], error) {
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := h.names.get(ctx, n.TenantID, n.SiteID, n.PoolID)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.NodeResponse{Node: nodeProto(n, nm)}), nil
}

func (h *nodes) Enroll(ctx context.Context, req *connect.Request[bcdv1.EnrollRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	m := req.Msg
	in := metal.EnrollInput{Name: m.Name, Pool: m.Pool, MACs: m.Macs, ProductUUID: m.ProductUuid, Labels: m.Labels, Reason: m.Reason, BMC: bmcInput(m.Bmc),
		BootMode: m.BootMode}
	n, err := h.svc.Enroll(ctx, principal(ctx), in)
	return h.respond(ctx, n, err)
}

func (h *nodes) Get(ctx context.Context, req *connect.Request[bcdv1.GetNodeRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	n, err := h.svc.Get(ctx, principal(ctx), req.Msg.Node)
	resp, err := h.respond(ctx, n, err)
	if err != nil {
		return nil, err
	}
	a, err := h.svc.Activity(ctx, principal(ctx), n)
	if err != nil {
		return nil, toConnect(err)
	}
	addrs, err := h.svc.Addresses(ctx, principal(ctx), n)
	if err != nil {
		return nil, toConnect(err)
	}
	for _, l := range addrs {
		resp.Msg.Node.Addresses = append(resp.Msg.Node.Addresses, &bcdv1.NodeAddress{Mac: l.MAC, Ip: l.IP,
			ExpiresAt: store.Micros(l.Expires).Format(time.RFC3339)})
	}
	if a.Workflow != "" {
		resp.Msg.Node.Activity = &bcdv1.Activity{Workflow: a.Workflow, WorkflowState: a.WorkflowState, Step: int32(a.Step), Steps: int32(a.Steps),
			StepName: a.StepName, Phase: a.Phase, CommandKind: a.CommandKind, CommandState: a.CommandState,
			ProgressDone: a.ProgressDone, ProgressTotal: a.ProgressTotal, ProgressMessage: a.ProgressMessage, Error: a.Error,
			RamdiskPoweringOff: a.RamdiskPoweringOff}
		if a.RamdiskLingeringUntil != 0 {
			resp.Msg.Node.Activity.RamdiskLingeringUntil = store.Micros(a.RamdiskLingeringUntil).Format(time.RFC3339)
		}
	}
	return resp, nil
}

func (h *nodes) List(ctx context.Context, req *connect.Request[bcdv1.ListNodesRequest]) (*connect.Response[bcdv1.ListNodesResponse], error) {
	m := req.Msg
	list, next, err := h.svc.List(ctx, principal(ctx), metal.ListInput{Tenant: m.Tenant, State: m.State, Pool: m.Pool, Site: m.Site,
		Maintenance: m.Maintenance, Labels: m.Labels, Require: m.Require, PageSize: int(m.PageSize), PageToken: m.PageToken})
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := h.names.get(ctx, "", "", "")
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListNodesResponse{Nodes: make([]*bcdv1.Node, len(list)), NextPageToken: next}
	var facts map[string]hardware.Facts
	if m.Hardware {
		if facts, err = h.svc.HardwareOf(ctx, principal(ctx), list); err != nil {
			return nil, toConnect(err)
		}
	}
	for i, n := range list {
		out.Nodes[i] = nodeProto(n, nm)
		if f, ok := facts[n.ID]; ok {
			out.Nodes[i].Hardware = factsProto(f)
		}
	}
	return connect.NewResponse(out), nil
}

func (h *nodes) verb(ctx context.Context, v provision.Verb, in metal.VerbInput) (*connect.Response[bcdv1.NodeResponse], error) {
	n, _, err := h.svc.Apply(ctx, principal(ctx), v, in)
	return h.respond(ctx, n, err)
}

func simple(m *bcdv1.NodeVerbRequest) metal.VerbInput {
	return metal.VerbInput{Node: m.Node, Reason: m.Reason, ExpectedVersion: m.ExpectedVersion}
}

func (h *nodes) Manage(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbManage, simple(req.Msg))
}

func (h *nodes) Inspect(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbInspect, simple(req.Msg))
}

func (h *nodes) Provide(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbProvide, simple(req.Msg))
}

func (h *nodes) Deploy(ctx context.Context, req *connect.Request[bcdv1.DeployRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	m := req.Msg
	return h.verb(ctx, provision.VerbDeploy, metal.VerbInput{Node: m.Node, Reason: m.Reason, ExpectedVersion: m.ExpectedVersion, Profile: m.Profile, Image: m.Image, UserData: m.UserData})
}

func (h *nodes) Undeploy(ctx context.Context, req *connect.Request[bcdv1.UndeployRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	m := req.Msg
	return h.verb(ctx, provision.VerbUndeploy, metal.VerbInput{Node: m.Node, Reason: m.Reason, ExpectedVersion: m.ExpectedVersion, Wipe: m.Wipe})
}

func (h *nodes) Rescue(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbRescue, simple(req.Msg))
}

func (h *nodes) Unrescue(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbUnrescue, simple(req.Msg))
}

func (h *nodes) Retire(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbRetire, simple(req.Msg))
}

func (h *nodes) Recover(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbRecover, simple(req.Msg))
}

func (h *nodes) Abort(ctx context.Context, req *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return h.verb(ctx, provision.VerbAbort, simple(req.Msg))
}

func (h *nodes) Maintenance(ctx context.Context, req *connect.Request[bcdv1.MaintenanceRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	m := req.Msg
	return h.verb(ctx, provision.VerbMaintenance, metal.VerbInput{Node: m.Node, Reason: m.Reason, MaintenanceOn: m.On})
}

func (h *nodes) Update(ctx context.Context, req *connect.Request[bcdv1.UpdateNodeRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	m := req.Msg
	n, err := h.svc.Update(ctx, principal(ctx), metal.UpdateInput{Node: m.Node, BootMode: m.BootMode, Reason: m.Reason})
	return h.respond(ctx, n, err)
}

func (h *nodes) Power(ctx context.Context, req *connect.Request[bcdv1.PowerRequest]) (*connect.Response[bcdv1.PowerResponse], error) {
	m := req.Msg
	n, cmd, err := h.svc.Apply(ctx, principal(ctx), provision.VerbPower, metal.VerbInput{Node: m.Node, Reason: m.Reason, PowerAction: m.Action})
	resp, err := h.respond(ctx, n, err)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&bcdv1.PowerResponse{Node: resp.Msg.Node, CommandId: cmd}), nil
}

func (h *nodes) Delete(ctx context.Context, req *connect.Request[bcdv1.DeleteNodeRequest]) (*connect.Response[bcdv1.DeleteNodeResponse], error) {
	if err := h.svc.Delete(ctx, principal(ctx), req.Msg.Node, req.Msg.Reason); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.DeleteNodeResponse{}), nil
}

func (h *nodes) Events(ctx context.Context, req *connect.Request[bcdv1.ListEventsRequest]) (*connect.Response[bcdv1.ListEventsResponse], error) {
	var evs []store.Event
	var cursor string
	var err error
	q := metal.EventQuery{Node: req.Msg.Node, AfterID: req.Msg.AfterId, Limit: int(req.Msg.Limit), Kinds: req.Msg.Kinds,
		Newest: req.Msg.Newest, BeforeID: req.Msg.BeforeId, Cursor: req.Msg.AfterCursor}
	if req.Msg.Follow {
		evs, cursor, err = h.svc.Follow(ctx, principal(ctx), q)
	} else {
		evs, err = h.svc.ListEvents(ctx, principal(ctx), q)
	}
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := loadNames(ctx, h.svc.Store())
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListEventsResponse{Events: make([]*bcdv1.Event, len(evs)), Cursor: cursor}
	for i, e := range evs {
		out.Events[i] = eventProto(e, nm)
	}
	return connect.NewResponse(out), nil
}

func (h *nodes) Inventory(ctx context.Context, req *connect.Request[bcdv1.GetNodeInventoryRequest]) (*connect.Response[bcdv1.NodeInventoryResponse], error) {
	inv, err := h.svc.Inventory(ctx, principal(ctx), req.Msg.Node)
	if err != nil {
		return nil, toConnect(err)
	}
	raw, err := json.Marshal(inv.Inventory)
	if err != nil {
		return nil, toConnect(fmt.Errorf("writing the inventory of node %s: %w", inv.Node.Name, err))
	}
	return connect.NewResponse(&bcdv1.NodeInventoryResponse{Node: inv.Node.ID, Name: inv.Node.Name,
		UpdatedAt: store.Micros(inv.UpdatedAt).UTC().Format(time.RFC3339), Inventory: string(raw), Facts: factsProto(inv.Facts)}), nil
}

// factsProto is a machine's hardware facts as the API answers them.
func factsProto(f hardware.Facts) *bcdv1.HardwareFacts {
	return &bcdv1.HardwareFacts{CpuModel: f.CPUModel, Sockets: int32(f.Sockets), Cores: int32(f.Cores), Threads: int32(f.Threads),
		CpuFlags: f.CPUFlags, MemoryBytes: f.MemoryBytes, Disks: int32(f.Disks), DiskBytes: f.DiskBytes, LargestDiskBytes: f.LargestDiskBytes,
		Ssds: int32(f.SSDs), Nvme: int32(f.NVMe), Gpus: int32(f.GPUs), NvidiaGpus: int32(f.NVIDIAGPUs), Nics: int32(f.NICs),
		FastestNicMbps: int32(f.FastestNICMbps), BootMode: f.BootMode, Vendor: f.Vendor, Product: f.Product}
}

func (h *nodes) Commands(ctx context.Context, req *connect.Request[bcdv1.ListCommandsRequest]) (*connect.Response[bcdv1.ListCommandsResponse], error) {
	cmds, err := h.svc.Commands(ctx, principal(ctx), req.Msg.Node, req.Msg.Workflow, int(req.Msg.Limit))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListCommandsResponse{Commands: make([]*bcdv1.CommandRecord, len(cmds))}
	for i, c := range cmds {
		out.Commands[i] = &bcdv1.CommandRecord{Id: c.ID, Kind: c.Kind, State: c.State, Agent: c.TargetAgent, Attempts: int32(c.Attempts),
			Workflow: c.WorkflowID, Step: int32(c.StepIndex), CreatedAt: ts(c.CreatedAt), DeliveredAt: ts(c.DeliveredAt), FinishedAt: ts(c.FinishedAt),
			Error: c.Error, Progress: c.Progress, Destructive: c.Destructive, Attested: c.Attested, Batch: c.BatchID, Profile: c.Profile}
	}
	return connect.NewResponse(out), nil
}

func (h *nodes) Attestations(ctx context.Context, req *connect.Request[bcdv1.ListAttestationsRequest]) (*connect.Response[bcdv1.ListAttestationsResponse], error) {
	cmds, err := h.svc.Attestations(ctx, principal(ctx), req.Msg.Node, req.Msg.Kind, int(req.Msg.Limit))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListAttestationsResponse{Attestations: make([]*bcdv1.Attestation, len(cmds))}
	if h.verifier != nil {
		out.CaPem = string(h.verifier.CAPEM())
	}
	for i, c := range cmds {
		a := &bcdv1.Attestation{CommandId: c.ID, Kind: c.Kind, WorkflowId: c.WorkflowID, FinishedAt: store.Micros(c.FinishedAt).Format(time.RFC3339Nano),
			Generation: c.Generation, Result: c.Result, Signature: c.ResultSig,
			SigningInput: pki.SigningInput(engine.RecordedStatement(c))}
		if len(c.SignerCert) > 0 {
			a.SignerCertPem = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.SignerCert}))
		}
		if h.verifier == nil {
			a.VerifyError = "this server has no agent CA to check it against"
		} else if err := h.verifier.VerifyRecorded(c); err != nil {
			a.VerifyError = err.Error()
		} else {
			a.Verified = true
		}
		out.Attestations[i] = a
	}
	return connect.NewResponse(out), nil
}

func (h *nodes) Discovered(ctx context.Context, req *connect.Request[bcdv1.ListDiscoveredRequest]) (*connect.Response[bcdv1.ListDiscoveredResponse], error) {
	p := principal(ctx)
	if err := metal.Require(p, auth.Read); err != nil {
		return nil, toConnect(err)
	}
	if req.Msg.Site == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("site: is required: the name or id of a site"))
	}
	site, err := h.svc.Store().Site(ctx, req.Msg.Site)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return nil, toConnect(fmt.Errorf("site %q: %w", req.Msg.Site, store.ErrNotFound))
	}
	limit := int(req.Msg.Limit)
	if limit <= 0 || limit > metal.MaxPageSize {
		limit = 500
	}
	list, err := h.svc.Store().Discovered(ctx, site.ID, limit)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(discoveredList(list)), nil
}

func (h *nodes) Doctor(ctx context.Context, req *connect.Request[bcdv1.DoctorRequest]) (*connect.Response[bcdv1.DoctorResponse], error) {
	p := principal(ctx)
	if err := metal.Require(p, auth.Read); err != nil {
		return nil, toConnect(err)
	}
	st := h.svc.Store()
	out := &bcdv1.DoctorResponse{}
	failed, err := st.FailedInMaintenance(ctx, p.TenantID, 1000)
	if err != nil {
		return nil, toConnect(err)
	}
	for _, n := range failed {
		out.Failed = append(out.Failed, &bcdv1.DoctorFinding{Node: n.ID, Name: n.Name, State: n.State, FailedFrom: n.FailedFrom, FaultCode: n.FaultCode, Message: n.FaultMsg, Since: ts(n.UpdatedAt)})
	}
	stranded, err := st.StrandedNodes(ctx, 1000)
	if err != nil {
		return nil, toConnect(err)
	}
	for _, n := range stranded {
		if p.CanSeeTenant(n.TenantID) {
			out.Stranded = append(out.Stranded, &bcdv1.DoctorFinding{Node: n.ID, Name: n.Name, State: n.State, Message: "no active workflow and no wake-up queued", Since: ts(n.UpdatedAt)})
		}
	}
	short, err := h.svc.HardwareShort(ctx, p, 1000)
	if err != nil {
		return nil, toConnect(err)
	}
	for _, f := range short {
		out.HardwareShort = append(out.HardwareShort, &bcdv1.DoctorFinding{Node: f.Node.ID, Name: f.Node.Name, State: f.Node.State, Message: strings.Join(f.Unmet, "; "), Since: ts(f.Node.UpdatedAt)})
	}
	nm, err := h.names.get(ctx, "", "", "")
	if err != nil {
		return nil, toConnect(err)
	}
	agents, err := st.SiteAgents(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	// A tenant's token sees its own sites' agents only, and no servers: the control plane is
	// the installation's.
	sites, err := st.Sites(ctx, p.TenantID)
	if err != nil {
		return nil, toConnect(err)
	}
	visible := make(map[string]bool, len(sites))
	for _, s := range sites {
		visible[s.ID] = true
	}
	now := time.Now().UnixMicro()
	leases := map[string]store.SiteLease{}
	for _, a := range agents {
		if !visible[a.SiteID] {
			continue
		}
		l, ok := leases[a.SiteID]
		if !ok {
			if l, err = st.Lease(ctx, a.SiteID); err != nil {
				return nil, toConnect(err)
			}
			leases[a.SiteID] = l
		}
		da := &bcdv1.DoctorAgent{Id: a.ID, Kind: a.Kind, Site: nm.sites[a.SiteID], Connected: a.Connected, LastSeen: ts(a.LastSeen), Server: a.ServerID,
			CertExpires: ts(a.CertNotAfter), RenewalOverdue: renewalOverdue(a, now), Dhcp: a.DHCPMode, BootBinding: a.BootBinding,
			HoldsBootLease: l.HeldBy(a.ID, now)}
		if c := a.Cache; c != (store.ArtifactCache{}) {
			da.ArtifactCache = &bcdv1.DoctorArtifactCache{Artifacts: c.Artifacts, Bytes: c.Bytes, BoundBytes: c.Bound, Evictions: c.Evictions, EvictedBytes: c.EvictedBytes}
		}
		out.SiteAgents = append(out.SiteAgents, da)
	}
	depths, err := st.QueueDepths(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	for _, d := range depths {
		if visible[d.SiteID] {
			out.Queues = append(out.Queues, &bcdv1.DoctorQueue{Site: nm.sites[d.SiteID], RunsOn: d.RunsOn, Commands: int64(d.Commands), OldestQueuedAt: ts(d.Oldest),
				Waiting: readable.Duration(time.Duration(max(now-d.Oldest, 0)) * time.Microsecond)})
		}
	}
	var servers []store.Server
	if p.TenantID == "" {
		if servers, err = st.Servers(ctx); err != nil {
			return nil, toConnect(err)
		}
	}
	for _, sv := range servers {
		out.Servers = append(out.Servers, &bcdv1.DoctorServer{Id: sv.ID, StartedAt: ts(sv.StartedAt), LastSeen: ts(sv.LastSeen), Agents: int32(sv.Agents),
			ClockOffset: sv.ClockOffset.Round(time.Millisecond).String()})
	}
	// The restore witness, as the agent CA's rotation, is for an admin token without a tenant.
	if p.TenantID == "" && auth.Allows(p.Role, auth.Administer) {
		w, ok, err := st.RestoreWitnessed(ctx)
		if err != nil {
			return nil, toConnect(err)
		}
		if ok {
			out.RestoreWitness = &bcdv1.DoctorRestoreWitness{AgentId: w.AgentID, SeenFences: w.Seen.Fences, SeenBeats: w.Seen.Beats, At: ts(w.At), Command: w.Command}
		}
	}
	if out.PendingBatches, err = pendingBatches(ctx, h.svc, time.Now()); err != nil {
		return nil, toConnect(err)
	}
	if out.AgentCa, err = doctorAgentCA(ctx, h.svc, p); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

// renewalGrace is how long past its renewal time an agent's certificate may go unrenewed before
// doctor flags it: renewals are retried every 30 s at most, so an hour is many failures.
const renewalGrace = time.Hour

// renewalOverdue: the agent's certificate passed its renewal time more than renewalGrace ago
// (now in microseconds). Pure.
func renewalOverdue(a store.Agent, now int64) bool {
	return a.CertRenewAt > 0 && now > a.CertRenewAt+renewalGrace.Microseconds()
}

// ---------------------------------------------------------------- inventory

type inventory struct {
	svc    *metal.Service
	joiner SiteJoiner
}

func (h *inventory) PutDeployProfile(ctx context.Context, req *connect.Request[bcdv1.PutDeployProfileRequest]) (*connect.Response[bcdv1.DeployProfileResponse], error) {
	in := req.Msg.Profile
	if in == nil {
		in = &bcdv1.DeployProfile{}
	}
	if err := h.svc.PutDeployProfile(ctx, principal(ctx), in.Name, in.Definition); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.DeployProfileResponse{Profile: in}), nil
}

func (h *inventory) ListDeployProfiles(ctx context.Context, req *connect.Request[bcdv1.ListDeployProfilesRequest]) (*connect.Response[bcdv1.ListDeployProfilesResponse], error) {
	list, err := h.svc.DeployProfiles(ctx, principal(ctx))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListDeployProfilesResponse{}
	for _, name := range slices.Sorted(maps.Keys(list)) {
		out.Profiles = append(out.Profiles, &bcdv1.DeployProfile{Name: name, Definition: list[name]})
	}
	return connect.NewResponse(out), nil
}

func (h *inventory) DeleteDeployProfile(ctx context.Context, req *connect.Request[bcdv1.DeleteDeployProfileRequest]) (*connect.Response[bcdv1.DeleteDeployProfileResponse], error) {
	if err := h.svc.DeleteDeployProfile(ctx, principal(ctx), req.Msg.Name); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.DeleteDeployProfileResponse{}), nil
}

func (h *inventory) RevokeSiteAgent(ctx context.Context, req *connect.Request[bcdv1.RevokeSiteAgentRequest]) (*connect.Response[bcdv1.RevokeSiteAgentResponse], error) {
	a, site, err := h.svc.RevokeSiteAgent(ctx, principal(ctx), req.Msg.Agent, req.Msg.Reason)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.RevokeSiteAgentResponse{Agent: a.ID, Site: site.Name}), nil
}

func (h *inventory) CreateSiteJoinToken(ctx context.Context, req *connect.Request[bcdv1.CreateSiteJoinTokenRequest]) (*connect.Response[bcdv1.CreateSiteJoinTokenResponse], error) {
	p := principal(ctx)
	if err := metal.Require(p, auth.Administer); err != nil {
		return nil, toConnect(err)
	}
	if h.joiner == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server runs no agent gateway"))
	}
	// Checked in seconds, before the multiplication: seconds past int64 nanoseconds would wrap
	// into the range.
	secs := req.Msg.TtlSeconds
	if secs == 0 {
		secs = int64(time.Hour / time.Second)
	}
	if secs < 60 || secs > 7*24*3600 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("ttl_seconds %d: accepted are 60 to 604800 (0 for one hour)", req.Msg.TtlSeconds))
	}
	ttl := time.Duration(secs) * time.Second
	tok, expires, err := h.svc.CreateSiteJoinToken(ctx, p, req.Msg.Site, ttl, h.joiner.CreateSiteJoinToken)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.CreateSiteJoinTokenResponse{Token: tok, ExpiresAt: expires.Format(time.RFC3339),
		GatewayUrl: h.joiner.GatewayURL(), CaPem: string(h.joiner.CAPEM())}), nil
}

func (h *inventory) names(ctx context.Context) (names, error) { return loadNames(ctx, h.svc.Store()) }

func (h *inventory) CreateTenant(ctx context.Context, req *connect.Request[bcdv1.CreateTenantRequest]) (*connect.Response[bcdv1.TenantResponse], error) {
	tn, err := h.svc.CreateTenant(ctx, principal(ctx), req.Msg.Name)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.TenantResponse{Tenant: &bcdv1.Tenant{Id: tn.ID, Name: tn.Name, CreatedAt: ts(tn.CreatedAt)}}), nil
}

func (h *inventory) ListTenants(ctx context.Context, req *connect.Request[bcdv1.ListTenantsRequest]) (*connect.Response[bcdv1.ListTenantsResponse], error) {
	list, err := h.svc.Tenants(ctx, principal(ctx))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListTenantsResponse{}
	for _, tn := range list {
		out.Tenants = append(out.Tenants, &bcdv1.Tenant{Id: tn.ID, Name: tn.Name, CreatedAt: ts(tn.CreatedAt)})
	}
	return connect.NewResponse(out), nil
}

func siteProto(s store.Site, nm names) *bcdv1.Site {
	return &bcdv1.Site{Id: s.ID, Name: s.Name, Tenant: nm.tenants[s.TenantID], Labels: s.Labels, CreatedAt: ts(s.CreatedAt)}
}

func poolProto(p store.Pool, nm names) *bcdv1.Pool {
	return &bcdv1.Pool{Id: p.ID, Name: p.Name, Tenant: nm.tenants[p.TenantID], Site: nm.sites[p.SiteID], Policy: policyProto(p.Policy), CreatedAt: ts(p.CreatedAt)}
}

func (h *inventory) CreateSite(ctx context.Context, req *connect.Request[bcdv1.CreateSiteRequest]) (*connect.Response[bcdv1.SiteResponse], error) {
	s, err := h.svc.CreateSite(ctx, principal(ctx), req.Msg.Name, req.Msg.Tenant, req.Msg.Labels)
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := h.names(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.SiteResponse{Site: siteProto(s, nm)}), nil
}

func (h *inventory) ListSites(ctx context.Context, req *connect.Request[bcdv1.ListSitesRequest]) (*connect.Response[bcdv1.ListSitesResponse], error) {
	list, err := h.svc.Sites(ctx, principal(ctx), req.Msg.Tenant)
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := h.names(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListSitesResponse{}
	for _, s := range list {
		out.Sites = append(out.Sites, siteProto(s, nm))
	}
	return connect.NewResponse(out), nil
}

func (h *inventory) DeleteSite(ctx context.Context, req *connect.Request[bcdv1.DeleteSiteRequest]) (*connect.Response[bcdv1.DeleteSiteResponse], error) {
	if err := h.svc.DeleteSite(ctx, principal(ctx), req.Msg.Site); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.DeleteSiteResponse{}), nil
}

func (h *inventory) CreatePool(ctx context.Context, req *connect.Request[bcdv1.CreatePoolRequest]) (*connect.Response[bcdv1.PoolResponse], error) {
	p, err := h.svc.CreatePool(ctx, principal(ctx), req.Msg.Name, req.Msg.Site, policyFromProto(req.Msg.Policy))
	return h.pool(ctx, p, err)
}

func (h *inventory) UpdatePool(ctx context.Context, req *connect.Request[bcdv1.UpdatePoolRequest]) (*connect.Response[bcdv1.PoolResponse], error) {
	p, err := h.svc.UpdatePool(ctx, principal(ctx), req.Msg.Pool, policyFromProto(req.Msg.Policy))
	return h.pool(ctx, p, err)
}

func (h *inventory) pool(ctx context.Context, p store.Pool, err error) (*connect.Response[bcdv1.PoolResponse], error) {
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := h.names(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.PoolResponse{Pool: poolProto(p, nm)}), nil
}

func (h *inventory) ListPools(ctx context.Context, req *connect.Request[bcdv1.ListPoolsRequest]) (*connect.Response[bcdv1.ListPoolsResponse], error) {
	list, err := h.svc.Pools(ctx, principal(ctx), req.Msg.Tenant, req.Msg.Site)
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := h.names(ctx)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListPoolsResponse{}
	for _, p := range list {
		out.Pools = append(out.Pools, poolProto(p, nm))
	}
	return connect.NewResponse(out), nil
}

func (h *inventory) DeletePool(ctx context.Context, req *connect.Request[bcdv1.DeletePoolRequest]) (*connect.Response[bcdv1.DeletePoolResponse], error) {
	if err := h.svc.DeletePool(ctx, principal(ctx), req.Msg.Pool); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.DeletePoolResponse{}), nil
}

func (h *inventory) PutHardwareProfile(ctx context.Context, req *connect.Request[bcdv1.PutHardwareProfileRequest]) (*connect.Response[bcdv1.HardwareProfileResponse], error) {
	in := req.Msg.Profile
	if in == nil {
		in = &bcdv1.HardwareProfile{}
	}
	hp, err := h.svc.PutHardwareProfile(ctx, principal(ctx), store.HardwareProfile{Name: in.Name, Drivers: in.Drivers, LocalBoot: in.LocalBoot})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.HardwareProfileResponse{Profile: &bcdv1.HardwareProfile{Name: hp.Name, Drivers: hp.Drivers, LocalBoot: hp.LocalBoot}}), nil
}

func (h *inventory) ListHardwareProfiles(ctx context.Context, req *connect.Request[bcdv1.ListHardwareProfilesRequest]) (*connect.Response[bcdv1.ListHardwareProfilesResponse], error) {
	list, err := h.svc.HardwareProfiles(ctx, principal(ctx))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListHardwareProfilesResponse{}
	for _, hp := range list {
		out.Profiles = append(out.Profiles, &bcdv1.HardwareProfile{Name: hp.Name, Drivers: hp.Drivers, LocalBoot: hp.LocalBoot})
	}
	return connect.NewResponse(out), nil
}

// ---------------------------------------------------------------- tokens

type tokens struct{ svc *metal.Service }

func (h *tokens) Create(ctx context.Context, req *connect.Request[bcdv1.CreateTokenRequest]) (*connect.Response[bcdv1.CreateTokenResponse], error) {
	secret, tok, err := h.svc.CreateToken(ctx, principal(ctx), req.Msg.Name, auth.Role(req.Msg.Role), req.Msg.Tenant)
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := loadNames(ctx, h.svc.Store())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.CreateTokenResponse{Token: tokenProto(tok, nm), Secret: secret}), nil
}

func (h *tokens) List(ctx context.Context, req *connect.Request[bcdv1.ListTokensRequest]) (*connect.Response[bcdv1.ListTokensResponse], error) {
	list, err := h.svc.Tokens(ctx, principal(ctx))
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := loadNames(ctx, h.svc.Store())
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListTokensResponse{}
	for _, t := range list {
		out.Tokens = append(out.Tokens, tokenProto(t, nm))
	}
	return connect.NewResponse(out), nil
}

func (h *tokens) Revoke(ctx context.Context, req *connect.Request[bcdv1.RevokeTokenRequest]) (*connect.Response[bcdv1.RevokeTokenResponse], error) {
	tok, err := h.svc.RevokeToken(ctx, principal(ctx), req.Msg.Token)
	if err != nil {
		return nil, toConnect(err)
	}
	nm, err := loadNames(ctx, h.svc.Store())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.RevokeTokenResponse{Token: tokenProto(tok, nm)}), nil
}

func (h *tokens) WhoAmI(ctx context.Context, req *connect.Request[bcdv1.WhoAmIRequest]) (*connect.Response[bcdv1.WhoAmIResponse], error) {
	p := principal(ctx)
	nm, err := loadNames(ctx, h.svc.Store())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.WhoAmIResponse{Token: &bcdv1.Token{Id: p.TokenID, Name: p.Name, Role: string(p.Role), Tenant: nm.tenants[p.TenantID]}}), nil
}
