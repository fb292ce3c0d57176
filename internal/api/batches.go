package api

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
	"bcd/internal/store"
)

// batches serves BatchService: metal.bulk, the batches of destructive commands and their
// approvals, and the approvals policy.
type batches struct {
	svc   *metal.Service
	names *nameCache
}

func (h *batches) batchProto(ctx context.Context, b store.Batch) (*bcdv1.Batch, error) {
	nm, err := h.names.get(ctx, b.TenantID, b.SiteID, b.PoolID)
	if err != nil {
		return nil, err
	}
	return &bcdv1.Batch{Id: b.ID, Tenant: nm.tenants[b.TenantID], Site: nm.sites[b.SiteID], Pool: nm.pools[b.PoolID], Kind: b.Kind, Verb: b.Verb,
		Reason: b.Reason, RequestedBy: b.RequestedBy, State: b.State, Required: int32(b.Required), Approvers: b.Approvers, Size: int32(b.Size),
		Leaves: int32(b.Leaves), Parked: int32(b.Parked), DecidedBy: b.DecidedBy, DecisionReason: b.DecisionReason,
		CreatedAt: ts(b.CreatedAt), DecidedAt: ts(b.DecidedAt), StartedAt: ts(b.StartedAt), Image: b.Image, ImageDigest: b.ImageDigest}, nil
}

func (h *batches) Bulk(ctx context.Context, req *connect.Request[bcdv1.BulkRequest]) (*connect.Response[bcdv1.BulkResponse], error) {
	m := req.Msg
	res, err := h.svc.Bulk(ctx, principal(ctx), metal.BulkInput{Pool: m.Pool, Verb: m.Verb, Nodes: m.Nodes, Selectors: m.Selectors, Wipe: m.Wipe, Reason: m.Reason,
		Image: m.Image, Profile: m.Profile, UserData: m.UserData, Count: int(m.Count), Spread: m.Spread, Require: m.Require})
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.BulkResponse{Batch: &bcdv1.BulkBatch{BatchId: res.Batch.ID, Held: res.Held, Required: int32(res.Batch.Required), Size: int32(res.Batch.Size)},
		Nodes: make([]*bcdv1.BulkNodeResult, len(res.Nodes))}
	for i, n := range res.Nodes {
		out.Nodes[i] = &bcdv1.BulkNodeResult{Node: n.Node, Name: n.Name, Accepted: n.Accepted, Error: n.Error, State: n.State}
	}
	if len(res.SpreadTaken) > 0 {
		out.SpreadTaken = make(map[string]int32, len(res.SpreadTaken))
		for v, n := range res.SpreadTaken {
			out.SpreadTaken[v] = int32(n)
		}
	}
	return connect.NewResponse(out), nil
}

func (h *batches) List(ctx context.Context, req *connect.Request[bcdv1.ListBatchesRequest]) (*connect.Response[bcdv1.ListBatchesResponse], error) {
	list, err := h.svc.Batches(ctx, principal(ctx), req.Msg.State, int(req.Msg.Limit))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListBatchesResponse{}
	for _, b := range list {
		pb, err := h.batchProto(ctx, b)
		if err != nil {
			return nil, toConnect(err)
		}
		out.Batches = append(out.Batches, pb)
	}
	return connect.NewResponse(out), nil
}

// maxBatchFailures is how many of a batch's failed nodes its answer names.
const maxBatchFailures = 100

func (h *batches) Get(ctx context.Context, req *connect.Request[bcdv1.GetBatchRequest]) (*connect.Response[bcdv1.GetBatchResponse], error) {
	b, leaves, err := h.svc.Batch(ctx, principal(ctx), req.Msg.Id, int(req.Msg.LeafLimit))
	if err != nil {
		return nil, toConnect(err)
	}
	pb, err := h.batchProto(ctx, b)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.GetBatchResponse{Batch: pb, Leaves: make([]*bcdv1.BatchLeaf, len(leaves))}
	for i, l := range leaves {
		out.Leaves[i] = &bcdv1.BatchLeaf{Subject: l.Subject, Kind: l.Kind}
	}
	fails, err := h.svc.BatchFailures(ctx, principal(ctx), b.ID)
	if err != nil {
		return nil, toConnect(err)
	}
	failed, aborted := metal.FailureCounts(fails)
	out.Failed, out.Aborted = int32(failed), int32(aborted)
	for _, f := range fails[:min(len(fails), maxBatchFailures)] {
		out.Failures = append(out.Failures, &bcdv1.BatchFailure{Node: f.NodeID, Name: f.Name, State: f.State, FaultCode: f.FaultCode, Error: f.Error, At: ts(f.At)})
	}
	return connect.NewResponse(out), nil
}

func (h *batches) decided(ctx context.Context, b store.Batch, err error) (*connect.Response[bcdv1.BatchResponse], error) {
	if err != nil {
		return nil, toConnect(err)
	}
	pb, err := h.batchProto(ctx, b)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.BatchResponse{Batch: pb}), nil
}

func (h *batches) Approve(ctx context.Context, req *connect.Request[bcdv1.BatchDecisionRequest]) (*connect.Response[bcdv1.BatchResponse], error) {
	b, err := h.svc.Approve(ctx, principal(ctx), req.Msg.Id, req.Msg.Reason)
	return h.decided(ctx, b, err)
}

func (h *batches) Withdraw(ctx context.Context, req *connect.Request[bcdv1.BatchDecisionRequest]) (*connect.Response[bcdv1.BatchResponse], error) {
	b, err := h.svc.Withdraw(ctx, principal(ctx), req.Msg.Id, req.Msg.Reason)
	return h.decided(ctx, b, err)
}

func (h *batches) Reject(ctx context.Context, req *connect.Request[bcdv1.BatchDecisionRequest]) (*connect.Response[bcdv1.BatchResponse], error) {
	b, err := h.svc.Reject(ctx, principal(ctx), req.Msg.Id, req.Msg.Reason)
	return h.decided(ctx, b, err)
}

func approvalPolicyProto(p store.ApprovalPolicy) *bcdv1.ApprovalPolicy {
	return &bcdv1.ApprovalPolicy{Scope: p.Scope, Required: int32(p.Required), UpdatedBy: p.UpdatedBy, UpdatedAt: ts(p.UpdatedAt)}
}

func (h *batches) SetApprovalPolicy(ctx context.Context, req *connect.Request[bcdv1.SetApprovalPolicyRequest]) (*connect.Response[bcdv1.ApprovalPolicyResponse], error) {
	p, err := h.svc.SetApprovalPolicy(ctx, principal(ctx), req.Msg.Scope, req.Msg.Ref, int(req.Msg.Required))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.ApprovalPolicyResponse{Policy: approvalPolicyProto(p)}), nil
}

func (h *batches) ListApprovalPolicies(ctx context.Context, req *connect.Request[bcdv1.ListApprovalPoliciesRequest]) (*connect.Response[bcdv1.ListApprovalPoliciesResponse], error) {
	list, err := h.svc.ApprovalPolicies(ctx, principal(ctx))
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListApprovalPoliciesResponse{}
	for _, p := range list {
		out.Policies = append(out.Policies, approvalPolicyProto(p))
	}
	return connect.NewResponse(out), nil
}

func (h *nodes) RotateBmcCredential(ctx context.Context, req *connect.Request[bcdv1.RotateBmcCredentialRequest]) (*connect.Response[bcdv1.RotateBmcCredentialResponse], error) {
	res, err := h.svc.RotateBmcCredential(ctx, principal(ctx), req.Msg.Node, req.Msg.Reason)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.RotateBmcCredentialResponse{CommandId: res.CommandID, Version: res.Version, BatchId: res.BatchID}), nil
}

func (h *nodes) BmcCredentialVersions(ctx context.Context, req *connect.Request[bcdv1.ListBmcCredentialVersionsRequest]) (*connect.Response[bcdv1.ListBmcCredentialVersionsResponse], error) {
	list, err := h.svc.CredentialVersions(ctx, principal(ctx), req.Msg.Node)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListBmcCredentialVersionsResponse{}
	for _, v := range list {
		out.Versions = append(out.Versions, &bcdv1.BmcCredentialVersion{Version: v.Version, State: v.State, CommandId: v.CommandID, Error: v.Error,
			CreatedAt: ts(v.CreatedAt), DecidedAt: ts(v.DecidedAt)})
	}
	return connect.NewResponse(out), nil
}

// pendingBatches is the doctor's list: batches waiting for approval, oldest first.
func pendingBatches(ctx context.Context, svc *metal.Service, now time.Time) ([]*bcdv1.DoctorBatch, error) {
	list, err := svc.PendingBatches(ctx, principal(ctx), 1000)
	if err != nil {
		return nil, err
	}
	var out []*bcdv1.DoctorBatch
	for _, b := range list {
		out = append(out, &bcdv1.DoctorBatch{Id: b.ID, Kind: b.Kind, Verb: b.Verb, Size: int32(b.Size), Required: int32(b.Required),
			Approvals: int32(len(b.Approvers)), RequestedBy: b.RequestedBy, Since: ts(b.CreatedAt),
			Waiting: now.Sub(store.Micros(b.CreatedAt)).Round(time.Second).String()})
	}
	return out, nil
}
