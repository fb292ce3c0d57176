package site

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"bcd/internal/netboot"
)

// cacheInUse names the artifacts the cache keeps whatever their age and the bound: those the
// boot entries boot, the ISOs BMCs' virtual media may read, the configured ramdisk (every
// ramdisk entry and the discovery boot boot it) and those a retry loop still fetches.
func (a *Agent) cacheInUse(context.Context) (map[string]bool, error) {
	set := map[string]bool{}
	a.entries.AddDigests(set)
	a.mounts.AddDigests(set)
	for _, art := range []netboot.Artifact{a.cfg.Ramdisk.Kernel, a.cfg.Ramdisk.Initrd} {
		if art.SHA256 != "" {
			set[strings.ToLower(art.SHA256)] = true
		}
	}
	a.fetchMu.Lock()
	for sha := range a.fetching {
		set[sha] = true
	}
	a.fetchMu.Unlock()
	return set, nil
}

// pruneLoop prunes the artifact cache at the start, after each download, and every
// CachePruneInterval, until ctx ends; the status reports then carry its new counts.
func (a *Agent) pruneLoop(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(a.cfg.CachePruneInterval)
	defer t.Stop()
	st := a.cache.Stats()
	log.Info("artifact cache", "artifacts", st.Artifacts, "bytes", st.Bytes, "bound_bytes", st.Bound, "retain", st.Retain.String(),
		"prune_interval", a.cfg.CachePruneInterval.String())
	for {
		added := a.cache.Added()
		res, err := a.cache.Prune(ctx, a.cacheInUse)
		if err != nil && ctx.Err() == nil {
			log.Warn("pruning the artifact cache", "err", err)
		}
		if len(res.Evicted) > 0 {
			var freed int64
			for _, e := range res.Evicted {
				freed += e.Bytes
			}
			log.Info("artifact cache pruned", "evicted", len(res.Evicted), "freed_bytes", freed,
				"artifacts", res.Stats.Artifacts, "bytes", res.Stats.Bytes, "bound_bytes", res.Stats.Bound)
		}
		a.poke()
		select {
		case <-ctx.Done():
			return
		case <-added:
		case <-t.C:
		}
	}
}

// statusFacts are the facts of the status reports: the boot services, and the artifact
// cache's counts.
func (a *Agent) statusFacts() map[string]string {
	st := a.cache.Stats()
	return map[string]string{
		"bootUrl": a.baseURL, "dhcp": string(a.cfg.DHCPMode), "bootBinding": string(a.cfg.BootBinding),
		"cacheArtifacts":    strconv.Itoa(st.Artifacts),
		"cacheBytes":        strconv.FormatInt(st.Bytes, 10),
		"cacheBoundBytes":   strconv.FormatInt(st.Bound, 10), // 0: none
		"cacheRetain":       st.Retain.String(),              // 0s: kept until the bound needs the room
		"cacheEvictions":    strconv.FormatInt(st.Evictions, 10),
		"cacheEvictedBytes": strconv.FormatInt(st.EvictedBytes, 10),
	}
}
