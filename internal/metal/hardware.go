package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"bcd/internal/auth"
	"bcd/internal/hardware"
	"bcd/internal/provision"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/store"
)

// NodeInventory is a node's inventory as its ramdisk last reported it (inventory.refresh, at
// inspection), and the figures requirements compare (hardware.Facts).
type NodeInventory struct {
	Node      store.Node
	UpdatedAt int64 // microseconds
	Inventory inventory.Inventory
	Facts     hardware.Facts
}

// Inventory returns a node's inventory: not_found for a node that never reported one (inspect
// it).
func (s *Service) Inventory(ctx context.Context, p auth.Principal, ref string) (NodeInventory, error) {
	n, err := s.Get(ctx, p, ref)
	if err != nil {
		return NodeInventory{}, err
	}
	stored, err := s.st.Inventory(ctx, n.ID)
	if errors.Is(err, store.ErrNotFound) {
		return NodeInventory{}, fmt.Errorf("node %s has no inventory yet: its ramdisk reports one when it is inspected (bcd node inspect): %w", n.Name, store.ErrNotFound)
	}
	if err != nil {
		return NodeInventory{}, err
	}
	out := NodeInventory{Node: n, UpdatedAt: stored.UpdatedAt}
	if err := json.Unmarshal([]byte(stored.JSON), &out.Inventory); err != nil {
		return NodeInventory{}, fmt.Errorf("reading the inventory of node %s: %w", n.Name, err)
	}
	out.Facts = hardware.Summarize(out.Inventory)
	return out, nil
}

// HardwareOf returns the hardware facts of nodes (already read as p may see them) from their
// stored inventories, by node id: a node without one is absent.
func (s *Service) HardwareOf(ctx context.Context, p auth.Principal, nodes []store.Node) (map[string]hardware.Facts, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	return s.factsOf(ctx, nodes)
}

// factsOf reads the stored inventories of nodes and summarises each: a node that never
// reported one, or whose inventory this server cannot read, is absent. It reads 512 nodes'
// inventories at a time (a real one is several KiB: a fleet's at once would be a large heap).
func (s *Service) factsOf(ctx context.Context, nodes []store.Node) (map[string]hardware.Facts, error) {
	out := make(map[string]hardware.Facts, len(nodes))
	for chunk := range slices.Chunk(nodes, 512) {
		ids := make([]string, len(chunk))
		for i, n := range chunk {
			ids[i] = n.ID
		}
		invs, err := s.st.Inventories(ctx, ids)
		if err != nil {
			return nil, err
		}
		for id, stored := range invs {
			var inv inventory.Inventory
			if json.Unmarshal([]byte(stored.JSON), &inv) == nil {
				out[id] = hardware.Summarize(inv)
			}
		}
	}
	return out, nil
}

// meeting returns the nodes (of nodes) whose stored inventory meets every requirement, and how
// many of the others have none to check (factsOf): all of them, without requirements.
func (s *Service) meeting(ctx context.Context, nodes []store.Node, reqs []hardware.Requirement) ([]store.Node, int, error) {
	if len(reqs) == 0 {
		return nodes, 0, nil
	}
	facts, err := s.factsOf(ctx, nodes)
	if err != nil {
		return nil, 0, err
	}
	var out []store.Node
	uninspected := 0
	for _, n := range nodes {
		f, ok := facts[n.ID]
		if !ok {
			uninspected++
			continue
		}
		if _, unmet := hardware.Unmet(f, reqs); !unmet {
			out = append(out, n)
		}
	}
	return out, uninspected, nil
}

// uninspectedNote tells of the nodes left out for want of an inventory.
func uninspectedNote(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "; 1 node that can deploy now has no inventory to check (bcd node inspect it)"
	}
	return fmt.Sprintf("; %d nodes that can deploy now have no inventory to check (bcd node inspect them)", n)
}

// requirementStrings writes requirements as they are recorded (sizes in bytes).
func requirementStrings(reqs []hardware.Requirement) []string {
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = r.String()
	}
	return out
}

// HardwareFinding is a node whose stored inventory does not meet its pool's hardware
// requirements as they are now (Unmet: each requirement and what the node has), or that has no
// inventory to check.
type HardwareFinding struct {
	Node  store.Node
	Unmet []string
}

// checkedStates are the states whose nodes HardwareShort looks at: at rest with their
// inspection behind them (a failed node is in the doctor's other list, a retired one is gone,
// one in a workflow is checked at its inspection).
var checkedStates = []provision.State{provision.Manageable, provision.Ready, provision.Deployed, provision.Rescue}

// HardwareShort lists, for the doctor, up to limit nodes at rest in pools with hardware
// requirements whose stored inventory does not meet them now: a requirement added after their
// inspection, or one the inventory never met. They keep working; their next inspection fails
// them with HARDWARE_MISMATCH unless they are repaired.
func (s *Service) HardwareShort(ctx context.Context, p auth.Principal, limit int) ([]HardwareFinding, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	pools, err := s.st.Pools(ctx, p.TenantID, "")
	if err != nil {
		return nil, err
	}
	var out []HardwareFinding
	for _, pool := range pools {
		reqs, err := hardware.ParseAll(pool.Policy.HardwareRequirements)
		if err != nil || len(reqs) == 0 {
			continue
		}
		nodes, err := s.st.Nodes(ctx, store.NodeFilter{PoolID: pool.ID, Limit: 1000000})
		if err != nil {
			return nil, err
		}
		nodes = slices.DeleteFunc(nodes, func(n store.Node) bool { return !slices.Contains(checkedStates, provision.State(n.State)) })
		facts, err := s.factsOf(ctx, nodes)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			if f, ok := facts[n.ID]; !ok {
				out = append(out, HardwareFinding{Node: n, Unmet: []string{"no inventory to check (bcd node inspect it)"}})
			} else if unmet := hardware.Unmets(f, reqs); len(unmet) > 0 {
				out = append(out, HardwareFinding{Node: n, Unmet: unmet})
			}
			if len(out) >= limit {
				return out, nil
			}
		}
	}
	return out, nil
}
