package site

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/netboot"
)

// Media paths: how an inserted ISO reaches the machine.
const (
	MediaVirtual = "virtualMedia" // the BMC's virtual CD, fed from the site cache
	MediaSanboot = "sanboot"      // an iPXE sanboot entry of the ISO in the site cache
)

type mediaResult struct {
	Via   string `json:"via"`
	Image string `json:"image,omitempty"`
	URL   string `json:"url,omitempty"`
}

// mediaArtifact is the ISO of a bmc.media insert as the site cache names it. Pure.
func mediaArtifact(a commandArgs) (netboot.Artifact, error) {
	name := a.Image + ".iso"
	art := netboot.Artifact{Name: name, URL: a.URL, SHA256: strings.ToLower(a.SHA256)}
	if err := art.Validate(); err != nil {
		return netboot.Artifact{}, fmt.Errorf("arguments: the iso: %w", err)
	}
	return art, nil
}

// unsupported reports whether err says no driver of the BMC has the capability (as opposed to
// the BMC failing the call). Pure.
func unsupported(err error, capability string) bool {
	var ae *AttemptsError
	if !errors.As(err, &ae) || len(ae.Attempts) == 0 {
		return false
	}
	for _, at := range ae.Attempts {
		if at.Err == nil || !strings.Contains(at.Err.Error(), "the driver cannot "+capability) {
			return false
		}
	}
	return true
}

// bmcMedia inserts or ejects a catalog ISO. Insert: the ISO is fetched into the site cache
// (served only once its sha256 matched), then handed to the BMC's virtual media by its cache
// URL; a driver without virtual media gets an iPXE sanboot entry of it instead (setBootDevice
// cd then sets PXE). Eject undoes whichever it was. The cache keeps an ISO a BMC may read
// (mediaMounts) until it is ejected or replaced, and one a sanboot entry boots while the entry
// stays.
func (h *handler) bmcMedia(ctx context.Context, a commandArgs) (any, error) {
	switch a.Action {
	case "insert":
		art, err := mediaArtifact(a)
		if err != nil {
			return nil, err
		}
		// Recorded before the fetch: the cache keeps the ISO from then on (pruning spares it),
		// for as long as the BMC may read it.
		added, err := h.mounts.Add(a.NodeID, art, time.Now())
		if err != nil {
			return nil, err
		}
		// forget drops the record of an ISO the BMC did not take (kept if it was recorded
		// before: the BMC may have it from an earlier insert).
		forget := func() {
			if added {
				if err := h.mounts.Drop(a.NodeID, art.SHA256); err != nil {
					h.log.WarnContext(ctx, "the cache keeps an ISO no BMC reads until the node's next eject", "node", a.NodeID, "err", err)
				}
			}
		}
		if err := h.cache.Fetch(ctx, art); err != nil {
			forget()
			return nil, fmt.Errorf("caching the iso %s: %w", a.Image, err)
		}
		url := h.baseURL + netboot.ArtifactPath + art.SHA256 + "/" + art.Name
		err = h.onBMC(ctx, a, "insert virtual media", capMedia, func(ctx context.Context, drv any) error {
			return drv.(bmc.VirtualMedia).InsertMedia(ctx, url)
		})
		if err == nil {
			// The BMC replaced what it had: only this ISO is read now.
			if err := h.mounts.Only(a.NodeID, art.SHA256); err != nil {
				h.log.WarnContext(ctx, "the cache keeps the node's earlier ISOs until its next eject", "node", a.NodeID, "err", err)
			}
			return mediaResult{Via: MediaVirtual, Image: a.Image, URL: url}, nil
		}
		if !unsupported(err, capMedia) {
			// The BMC's virtual media is in an unknown state: every ISO it may read is kept.
			return nil, err
		}
		macs, err := canonicalMACs(a.MACs)
		if err != nil {
			forget()
			return nil, err
		}
		// The sanboot entry references the ISO from now on.
		if err := h.entries.Install(a.NodeID, macs, netboot.Entry{Kind: netboot.KindSanboot, ISO: art}); err != nil {
			forget()
			return nil, err
		}
		forget()
		h.changed()
		return mediaResult{Via: MediaSanboot, Image: a.Image}, nil
	case "eject":
		if h.entries.KindOf(a.NodeID) == netboot.KindSanboot {
			if err := h.entries.RemoveKind(a.NodeID, netboot.KindSanboot); err != nil {
				return nil, err
			}
			h.changed()
			return mediaResult{Via: MediaSanboot}, nil
		}
		err := h.onBMC(ctx, a, "eject virtual media", capMedia, func(ctx context.Context, drv any) error {
			return drv.(bmc.VirtualMedia).EjectMedia(ctx)
		})
		if err != nil && !unsupported(err, capMedia) {
			return nil, err
		}
		if err := h.mounts.Clear(a.NodeID); err != nil {
			return nil, err
		}
		return mediaResult{Via: MediaVirtual}, nil
	}
	return nil, fmt.Errorf("arguments: action %q: accepted are insert, eject", a.Action)
}
