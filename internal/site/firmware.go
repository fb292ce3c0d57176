package site

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/netboot"
)

// firmwareArtifact is a firmware image of bmc.firmware as the site cache names it. Pure.
func firmwareArtifact(u bmc.FirmwareImage) (netboot.Artifact, error) {
	art := netboot.Artifact{Name: u.Image + ".bin", URL: u.URL, SHA256: strings.ToLower(u.SHA256)}
	if err := art.Validate(); err != nil {
		return netboot.Artifact{}, fmt.Errorf("arguments: the firmware image of %s: %w", u.Component, err)
	}
	return art, nil
}

// outdated reports whether u's component runs another version than the one wanted (a
// component the BMC does not report is updated too: the image may bring it). Pure.
func outdated(have []bmc.Firmware, u bmc.FirmwareImage) bool {
	f, ok := bmc.FindFirmware(have, u.Component)
	return !ok || f.Version != u.Version
}

// bmcFirmware installs the pool's firmware images on the components that run another version
// than the baseline's: each image is fetched into the site cache (served only once its sha256
// matched, and kept while the BMC reads it), and the BMC fetches it from the agent's boot HTTP
// and installs it, the call returning when the BMC's update task ended. The new versions run
// after the next reset: the result says which components were updated (Pending), and the
// control plane boots the node anew and checks the baseline after that boot.
func (h *handler) bmcFirmware(ctx context.Context, a commandArgs) (any, error) {
	if len(a.Updates) == 0 || len(a.Updates) > bmc.MaxFirmwareComponents {
		return nil, fmt.Errorf("arguments: updates: %d firmware images; 1-%d are accepted", len(a.Updates), bmc.MaxFirmwareComponents)
	}
	arts := make([]netboot.Artifact, len(a.Updates))
	for i, u := range a.Updates {
		if u.Component == "" || u.Version == "" || u.Image == "" {
			return nil, fmt.Errorf("arguments: updates[%d]: component, version and image are required", i)
		}
		art, err := firmwareArtifact(u)
		if err != nil {
			return nil, err
		}
		arts[i] = art
	}
	res := bmc.FirmwareUpdateResult{Updated: []string{}}
	err := h.onBMC(ctx, a, "update firmware", capFirmwareUpdate, func(ctx context.Context, drv any) error {
		have, err := drv.(bmc.FirmwareReader).Firmware(ctx)
		if err != nil {
			return fmt.Errorf("reading the firmware versions: %w", err)
		}
		for i, u := range a.Updates {
			if !outdated(have, u) {
				continue
			}
			if err := h.installFirmware(ctx, drv.(bmc.FirmwareUpdater), a.NodeID, have, u, arts[i]); err != nil {
				return err
			}
			res.Updated = append(res.Updated, u.Component)
		}
		return nil
	})
	slices.Sort(res.Updated)
	res.Pending = len(res.Updated) > 0
	if err != nil {
		// Components already updated stay pending: the error says which were.
		if res.Pending {
			return nil, fmt.Errorf("%w (already installed, pending the next reset: %s)", err, strings.Join(res.Updated, ", "))
		}
		return nil, err
	}
	return res, nil
}

// installFirmware fetches one image into the cache, keeps it there while the BMC reads it, and
// has the BMC install it on the component (its inventory id as the BMC reported it).
func (h *handler) installFirmware(ctx context.Context, drv bmc.FirmwareUpdater, nodeID string, have []bmc.Firmware, u bmc.FirmwareImage, art netboot.Artifact) error {
	added, err := h.mounts.Add(nodeID, art, time.Now())
	if err != nil {
		return err
	}
	if added {
		defer func() {
			if err := h.mounts.Drop(nodeID, art.SHA256); err != nil {
				h.log.WarnContext(ctx, "the cache keeps a firmware image until the node's next eject", "node", nodeID, "err", err)
			}
		}()
	}
	if err := h.cache.Fetch(ctx, art); err != nil {
		return fmt.Errorf("caching the firmware image %s: %w", u.Image, err)
	}
	target := u.Component
	if f, ok := bmc.FindFirmware(have, u.Component); ok {
		target = f.ID
	}
	url := h.baseURL + netboot.ArtifactPath + art.SHA256 + "/" + art.Name
	log := h.log.With("node", nodeID, "component", u.Component, "image", u.Image, "version", u.Version)
	log.InfoContext(ctx, "installing firmware")
	last := -1
	progress := func(percent int) {
		if percent/25 != last/25 { // a line per quarter, not per poll
			last = percent
			log.InfoContext(ctx, "firmware update progress", "percent", percent)
		}
	}
	if err := drv.UpdateFirmware(ctx, url, []string{target}, progress); err != nil {
		return fmt.Errorf("installing %s on %s: %w", u.Image, u.Component, err)
	}
	log.InfoContext(ctx, "firmware installed, pending the next reset")
	return nil
}
