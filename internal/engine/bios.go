package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"bcd/internal/bmc"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// biosSettings are the node's pool's BIOS settings (nil: none, or no pool).
func (r *run) biosSettings() (map[string]string, error) {
	p, _, err := r.nodePool()
	return p.Policy.BIOSSettings, err
}

// biosArgs adds what bios.apply (bmc.bios: the settings) and bios.verify (bmc.query{query:
// bios}: the attribute names) send, from the pool's settings as they are when the step starts.
func (r *run) biosArgs(kind string, args map[string]any) error {
	settings, err := r.biosSettings()
	if err != nil {
		return err
	}
	if len(settings) == 0 {
		return fmt.Errorf("the pool of node %s names no BIOS settings", r.n.ID)
	}
	if kind == "bmc.bios" {
		args["attributes"] = settings
	} else {
		args["names"] = slices.Sorted(maps.Keys(settings))
	}
	return nil
}

// takeBIOSWrite records what bios.apply wrote (an event: the attributes, pending until the next
// reset).
func (r *run) takeBIOSWrite(c store.Command) error {
	var res bmc.BIOSWriteResult
	if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
		return fmt.Errorf("bmc.bios result is not JSON: %w", err)
	}
	return r.event("node.bios", r.n.State, r.n.State, "", map[string]any{"command": c.ID, "written": res.Changed, "pending": res.Pending})
}

// checkBIOS takes bios.verify's result: the attributes the BMC reports after the boot, compared
// with the pool's settings as they are now. The values are recorded in an event either way.
func (r *run) checkBIOS(c store.Command) error {
	var res bmc.BIOSReadResult
	if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
		return fmt.Errorf("BIOS query result is not JSON: %w", err)
	}
	settings, err := r.biosSettings()
	if err != nil {
		return err
	}
	drift := bmc.BIOSDrift(settings, res.Attributes)
	if err := r.event("node.bios", r.n.State, r.n.State, "", map[string]any{"command": c.ID, "attributes": res.Attributes,
		"settings": len(settings), "drift": drift}); err != nil {
		return err
	}
	if len(drift) > 0 {
		// After the boot that should have applied them: the BMC took the write and did not.
		return &driftError{fault: provision.FaultBIOSDrift, what: "BIOS settings differ from the pool's after the boot that applies them",
			hint: "the BMC took the write and did not apply it; check the BMC's configuration jobs, or change the pool's biosSettings", lines: drift}
	}
	return nil
}
