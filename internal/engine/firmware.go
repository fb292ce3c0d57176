package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"bcd/internal/bmc"
	"bcd/internal/catalog"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// FirmwareCheckStep is the step that compares what the node's BMC reports with its pool's
// firmware baseline (bmc.query{query: firmware}); it runs only where the pool has a baseline.
const FirmwareCheckStep = "firmware.check"

// driftError is a check that found the node off its pool's policy (firmware.check: its
// baseline; bios.verify: its BIOS settings): the step fails with the drift's fault, not a retry
// (the BMC answered, and a retry reads the same values). Its message: what differs, one line per
// item, between what and hint.
type driftError struct {
	fault      provision.Fault
	what, hint string
	lines      []string
}

func (e *driftError) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.what, strings.Join(e.lines, "; "), e.hint)
}

// driftFault is the fault of a step's result error: a drift's, else def.
func driftFault(err error, def provision.Fault) provision.Fault {
	var d *driftError
	if errors.As(err, &d) {
		return d.fault
	}
	return def
}

// firmwareBaseline is the node's pool's baseline (nil: none, or no pool).
func (r *run) firmwareBaseline() (map[string]string, error) {
	p, _, err := r.nodePool()
	return p.Policy.FirmwareBaseline, err
}

// checkFirmware takes firmware.check's result: the versions the BMC reported, compared with the
// pool's baseline as it is now (an operator who changed it meanwhile gets the new one). The
// versions are recorded in an event either way, so an operator sees what runs.
func (r *run) checkFirmware(c store.Command) error {
	var res struct {
		Firmware []bmc.Firmware `json:"firmware"`
	}
	if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
		return fmt.Errorf("firmware query result is not JSON: %w", err)
	}
	baseline, err := r.firmwareBaseline()
	if err != nil {
		return err
	}
	drift := bmc.Drift(baseline, res.Firmware)
	versions := map[string]string{}
	for _, f := range res.Firmware {
		versions[f.ID] = f.Version
	}
	if err := r.event("node.firmware", r.n.State, r.n.State, "", map[string]any{"command": c.ID, "versions": versions,
		"baseline": len(baseline), "drift": drift}); err != nil {
		return err
	}
	if len(drift) > 0 {
		return &driftError{fault: provision.FaultFirmwareDrift, what: "firmware differs from the pool's baseline",
			hint: "update it, or change the pool's firmwareBaseline", lines: drift}
	}
	return nil
}

// firmwareUpdateArgs adds what firmware.update (bmc.firmware) sends: for each of the pool's
// firmware images, the component, the baseline's version and the image, verified now (a signer
// revoked, or the image changed, since the pool named it: refused before the BMC gets it).
func (r *run) firmwareUpdateArgs(args map[string]any) error {
	p, _, err := r.nodePool()
	if err != nil {
		return err
	}
	images := p.Policy.FirmwareImages
	if len(images) == 0 {
		return fmt.Errorf("the pool of node %s names no firmware images", r.n.ID)
	}
	var updates []bmc.FirmwareImage
	for _, comp := range slices.Sorted(maps.Keys(images)) {
		want, ok := p.Policy.FirmwareBaseline[comp]
		if !ok {
			return fmt.Errorf("the pool's firmware image for %s has no version in its baseline", comp)
		}
		img, err := r.tx.VerifiedImage(r.ctx, images[comp])
		if err != nil {
			return fmt.Errorf("refusing to install firmware image %s on %s: %w", images[comp], comp, err)
		}
		if img.Format != catalog.FormatFirmware || img.SHA256 == "" {
			return fmt.Errorf("refusing to install image %s on %s: it is a %s image, not firmware with a sha256", img.Name, comp, img.Format)
		}
		updates = append(updates, bmc.FirmwareImage{Component: comp, Version: want, Image: img.Name, URL: img.URL, Size: img.Size, SHA256: img.SHA256})
	}
	args["updates"] = updates
	return nil
}

// takeFirmwareUpdate records what firmware.update installed (an event: the components, pending
// until the next reset).
func (r *run) takeFirmwareUpdate(c store.Command) error {
	var res bmc.FirmwareUpdateResult
	if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
		return fmt.Errorf("bmc.firmware result is not JSON: %w", err)
	}
	return r.event("node.firmware.update", r.n.State, r.n.State, "", map[string]any{"command": c.ID, "updated": res.Updated, "pending": res.Pending})
}
