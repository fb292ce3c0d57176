package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"bcd/internal/hardware"
	"bcd/internal/provision"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// MAC binding of a node enrolled with a product UUID and no MAC (DESIGN §6 Discovery): its
// ensureRamdisk power-cycles it into PXE with no boot entry; the site agent reports the MAC it
// boots with and the UUID iPXE saw; await.macCandidate decides here.
const (
	// MACWindow: a MAC counts only when it was seen within this long after the power cycle.
	MACWindow = 10 * time.Minute
	// MACUniqueness: the UUID must have come from that MAC alone for this long.
	MACUniqueness = 24 * time.Hour
)

// macOutcome is what await.macCandidate does next.
type macOutcome int

const (
	macWait    macOutcome = iota // nothing decided yet: look again at Until (or when woken)
	macDone                      // the node has a MAC: the step is done
	macPropose                   // record MAC as the candidate, wait for the operator
	macBind                      // bind MAC now (trusted provisioning network)
	macFail                      // fail the step with Fault
)

// macInput is everything the decision reads. Times are Unix microseconds.
type macInput struct {
	NodeID, SiteID, UUID string
	MACs                 int
	Window               time.Duration // MACWindow unless configured
	CycleAt, Now         int64
	Deadline             int64 // the step's
	// Sightings under the UUID in either byte order, last seen within MACUniqueness, every site.
	Sightings []store.Discovery
	// Owners maps a sighted MAC to the node it belongs to (absent: none).
	Owners map[string]string
	// Pending is this workflow's candidate awaiting confirmation, "" when none.
	Pending string
	Trust   bool
}

type macDecision struct {
	Outcome macOutcome
	MAC     string
	SeenAt  int64
	Until   int64
	Fault   provision.Fault
	Reason  string
}

// decideMAC is await.macCandidate's decision. Pure.
func decideMAC(in macInput) macDecision {
	switch {
	case in.MACs > 0:
		return macDecision{Outcome: macDone}
	case in.UUID == "":
		return macDecision{Outcome: macFail, Fault: provision.FaultMACNotDiscovered,
			Reason: "the node has neither a MAC nor a product UUID: nothing can tell which PXE-booting machine it is (enroll it with its MACs)"}
	case in.Pending != "":
		if in.Now >= in.Deadline {
			return macDecision{Outcome: macFail, Fault: provision.FaultMACUnconfirmed, MAC: in.Pending,
				Reason: fmt.Sprintf("candidate MAC %s was not confirmed in time (bcd node confirm-mac %s %s)", in.Pending, in.NodeID, in.Pending)}
		}
		return macDecision{Outcome: macWait, MAC: in.Pending, Until: in.Deadline}
	}
	windowEnd := in.CycleAt + in.Window.Microseconds()
	seen := map[string]int64{} // MAC seen at the node's site within the window → when
	all := map[string]bool{}   // every MAC the UUID came from within MACUniqueness
	for _, d := range in.Sightings {
		if !SameSMBIOSUUID(d.UUID, in.UUID) || d.LastSeen < in.Now-MACUniqueness.Microseconds() {
			continue
		}
		all[d.MAC] = true
		if d.SiteID != in.SiteID {
			continue
		}
		// Provably seen within [cycle, cycle+window]: first or last sighting falls in it.
		switch {
		case d.FirstSeen >= in.CycleAt && d.FirstSeen <= windowEnd:
			seen[d.MAC] = d.FirstSeen
		case d.LastSeen >= in.CycleAt && d.LastSeen <= windowEnd:
			seen[d.MAC] = d.LastSeen
		}
	}
	if len(seen) == 0 {
		if in.Now > windowEnd || in.Now >= in.Deadline {
			return macDecision{Outcome: macFail, Fault: provision.FaultMACNotDiscovered,
				Reason: fmt.Sprintf("no machine PXE-booted under product UUID %s within %s of the power cycle (is the node set to boot from the network on a NIC the site agent serves?)", in.UUID, min(in.Window, time.Duration(in.Deadline-in.CycleAt)*time.Microsecond))}
		}
		return macDecision{Outcome: macWait, Until: min(windowEnd+1, in.Deadline)}
	}
	if len(all) > 1 {
		macs := slicesSorted(all)
		return macDecision{Outcome: macFail, Fault: provision.FaultMACAmbiguous,
			Reason: fmt.Sprintf("product UUID %s came from %d MACs within %s (%s): none is taken as the node's; enroll the node with its MAC", in.UUID, len(macs), MACUniqueness, strings.Join(macs, ", "))}
	}
	var mac string
	for m := range seen {
		mac = m
	}
	if owner := in.Owners[mac]; owner != "" && owner != in.NodeID {
		return macDecision{Outcome: macFail, Fault: provision.FaultMACConflict, MAC: mac,
			Reason: fmt.Sprintf("MAC %s, seen under product UUID %s, belongs to node %s", mac, in.UUID, owner)}
	}
	if in.Trust {
		return macDecision{Outcome: macBind, MAC: mac, SeenAt: seen[mac]}
	}
	return macDecision{Outcome: macPropose, MAC: mac, SeenAt: seen[mac], Until: in.Deadline}
}

func slicesSorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// UUIDForms returns a UUID in its two SMBIOS byte orders (equal when the swap changes nothing
// or the text is not a UUID), lower case.
func UUIDForms(u string) (string, string) {
	u = strings.ToLower(u)
	return u, swapUUID(u)
}

// awaitMAC runs await.macCandidate.
func (r *run) awaitMAC(wf *store.Workflow, st workflow.Step) (time.Duration, bool, error) {
	n := &r.n
	now := r.tx.At()
	in := macInput{NodeID: n.ID, SiteID: n.SiteID, UUID: n.ProductUUID, MACs: len(n.MACs), Window: r.e.cfg.MACWindow, CycleAt: wf.BootEpoch, Now: now, Deadline: wf.StepDeadline}
	if in.CycleAt == 0 {
		in.CycleAt = wf.StepStartedAt
	}
	if in.MACs == 0 && in.UUID != "" {
		cand, ok, err := r.tx.MACCandidate(r.ctx, n.ID)
		if err != nil {
			return 0, false, err
		}
		if ok && cand.WorkflowID == wf.ID && cand.State == store.CandidatePending {
			in.Pending = cand.MAC
		}
		if in.Pending == "" {
			a, b := UUIDForms(n.ProductUUID)
			if in.Sightings, err = r.tx.Sightings(r.ctx, a, b, now-MACUniqueness.Microseconds()); err != nil {
				return 0, false, err
			}
			in.Owners = map[string]string{}
			for _, d := range in.Sightings {
				owner, err := r.tx.MACOwner(r.ctx, d.MAC)
				if err != nil {
					return 0, false, err
				}
				if owner != "" {
					in.Owners[d.MAC] = owner
				}
			}
			pool, err := r.tx.Pool(r.ctx, n.PoolID)
			if err != nil {
				return 0, false, fmt.Errorf("reading the pool of node %s: %w", n.ID, err)
			}
			in.Trust = pool.Policy.TrustProvisioningNetwork
		}
	}
	d := decideMAC(in)
	switch d.Outcome {
	case macDone:
		return 0, true, r.stepDone(wf, st, "")
	case macWait:
		return time.Duration(max(d.Until-now, 1)) * time.Microsecond, false, nil
	case macFail:
		if d.Fault == provision.FaultMACUnconfirmed {
			cand := store.MACCandidate{NodeID: n.ID, WorkflowID: wf.ID, SiteID: n.SiteID, MAC: d.MAC, UUID: n.ProductUUID, State: store.CandidateExpired, DecidedBy: "reconciler", DecidedAt: now}
			if old, ok, err := r.tx.MACCandidate(r.ctx, n.ID); err == nil && ok {
				cand.SeenAt, cand.CreatedAt = old.SeenAt, old.CreatedAt
			}
			if err := r.tx.PutMACCandidate(r.ctx, cand); err != nil {
				return 0, false, err
			}
		}
		return 0, true, r.stepFailed(wf, st, d.Fault, d.Reason, false)
	case macPropose:
		if err := r.tx.PutMACCandidate(r.ctx, store.MACCandidate{NodeID: n.ID, WorkflowID: wf.ID, SiteID: n.SiteID, MAC: d.MAC, UUID: n.ProductUUID,
			SeenAt: d.SeenAt, State: store.CandidatePending}); err != nil {
			return 0, false, err
		}
		if err := r.event("node.mac.candidate", n.State, n.State, "waiting for an operator's confirmation (bcd node confirm-mac)",
			map[string]any{"mac": d.MAC, "productUuid": n.ProductUUID, "workflow": wf.ID}); err != nil {
			return 0, false, err
		}
		return time.Duration(max(d.Until-now, 1)) * time.Microsecond, false, nil
	case macBind:
		if err := r.tx.AddNodeMAC(r.ctx, n, d.MAC); err != nil {
			if errors.Is(err, store.ErrConflict) {
				return 0, true, r.stepFailed(wf, st, provision.FaultMACConflict, err.Error(), false)
			}
			return 0, false, err
		}
		if err := r.tx.PutMACCandidate(r.ctx, store.MACCandidate{NodeID: n.ID, WorkflowID: wf.ID, SiteID: n.SiteID, MAC: d.MAC, UUID: n.ProductUUID,
			SeenAt: d.SeenAt, State: store.CandidateBound, DecidedBy: "pool:trustProvisioningNetwork", DecidedAt: now}); err != nil {
			return 0, false, err
		}
		if err := r.event("node.mac.bound", n.State, n.State, "the pool trusts its provisioning network",
			map[string]any{"mac": d.MAC, "productUuid": n.ProductUUID, "workflow": wf.ID}); err != nil {
			return 0, false, err
		}
		return 0, true, r.stepDone(wf, st, "")
	}
	return 0, false, fmt.Errorf("await.macCandidate: unknown outcome %d", d.Outcome)
}

// autoAccept accepts a machine a discovery-mode ramdisk just reported (its self-asserted
// inventory inv) when a pool of its site says autoAccept (off by default): its acceptance is
// recorded as the pool's (AcceptingPool chooses among several). It returns the pool when the
// acceptance is new and the pool also enrolls in-band (autoAcceptInband); otherwise enrolling
// it takes an operator (bcd node accept).
func autoAccept(ctx context.Context, tx *store.Tx, siteID, mac, inv string) (store.Pool, bool, error) {
	pools, err := tx.AutoAcceptPools(ctx, siteID)
	if err != nil {
		return store.Pool{}, false, err
	}
	pool, ok := AcceptingPool(pools, inv)
	if !ok {
		return store.Pool{}, false, nil
	}
	accepted, err := tx.AcceptPending(ctx, siteID, mac, "autoAccept:"+pool.Name)
	if err != nil || !accepted {
		return store.Pool{}, false, err
	}
	return pool, pool.Policy.AutoAcceptInband, nil
}

// AcceptingPool chooses, of a site's auto-accepting pools (by name), the one a machine that
// reported inventory inv (self-asserted, a discovery-mode ramdisk's) is accepted into: the most
// specific whose hardware requirements it meets (the most requirements; then by name), so that
// GPU machines go to the pool that requires GPUs and the rest to one that requires nothing. A
// machine that meets no pool's is left for an operator; so is one whose inventory cannot be read
// where every pool has requirements. Its inspection as a node checks the requirements again
// against what its own ramdisk reports. Pure.
func AcceptingPool(pools []store.Pool, inv string) (store.Pool, bool) {
	var facts hardware.Facts
	var known bool
	var parsed inventory.Inventory
	if json.Unmarshal([]byte(inv), &parsed) == nil {
		facts, known = hardware.Summarize(parsed), true
	}
	best, found := store.Pool{}, false
	for _, p := range pools {
		reqs, err := hardware.ParseAll(p.Policy.HardwareRequirements)
		if err != nil || len(reqs) > 0 && !known {
			continue
		}
		if _, unmet := hardware.Unmet(facts, reqs); unmet {
			continue
		}
		if !found || len(reqs) > len(best.Policy.HardwareRequirements) {
			best, found = p, true
		}
	}
	return best, found
}

// autoEnroll is an acceptance autoAccept recorded that its pool enrolls in-band.
type autoEnroll struct {
	siteID, mac string
	pool        store.Pool
}

// autoEnrollAll enrolls what a status report's autoAccept accepted for in-band enrollment, after
// the report's transaction committed. A failure is logged; the machine stays accepted and
// pending for an operator (bcd node accept).
func (e *Engine) autoEnrollAll(ctx context.Context, as []autoEnroll) {
	if e.cfg.AutoEnroll == nil {
		return
	}
	for _, a := range as {
		if err := e.cfg.AutoEnroll(ctx, a.siteID, a.mac, a.pool); err != nil {
			e.log.Warn("auto-enrolling a discovered machine in-band failed: it stays accepted for an operator", "site", a.siteID, "mac", a.mac, "pool", a.pool.Name, "err", err)
		}
	}
}
