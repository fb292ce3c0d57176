package netboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"
)

// CacheStats is what the cache holds, and what it evicted since it was opened.
type CacheStats struct {
	Artifacts    int
	Bytes        int64
	Bound        int64         // 0: none
	Retain       time.Duration // 0: unused artifacts are kept until the bound needs their room
	Evictions    int64
	EvictedBytes int64
}

// PruneResult is what one Prune did.
type PruneResult struct {
	Evicted []Eviction
	// Spared: artifacts the plan picked that were used while the prune ran, and kept.
	Spared int
	// OverBound: the artifacts in use alone exceed the bound (nothing more could be evicted).
	OverBound bool
	Stats     CacheStats
}

// Stats reports what the cache holds now.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statsLocked()
}

func (c *Cache) statsLocked() CacheStats {
	s := CacheStats{Artifacts: len(c.held), Bound: max(c.policy.Bound, 0), Retain: max(c.policy.Retain, 0),
		Evictions: c.evictions, EvictedBytes: c.evictedBytes}
	for _, n := range c.held {
		s.Bytes += n
	}
	return s
}

// Added returns a channel closed when an artifact is next cached.
func (c *Cache) Added() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.added
}

// use records a use of the artifact with this digest, and writes it to its file's
// modification time if the last write is touchEvery old.
func (c *Cache) use(sha string) {
	now := c.now()
	c.mu.Lock()
	touch := c.useLocked(sha, now)
	c.mu.Unlock()
	if touch {
		c.touch(sha, now)
	}
}

// useLocked records a use at now; true when the file's modification time should be set.
func (c *Cache) useLocked(sha string, now time.Time) bool {
	c.seq++
	u := c.uses[sha]
	u.seq, u.at = c.seq, now
	touch := now.Sub(u.touched) >= touchEvery || now.Before(u.touched)
	if touch {
		u.touched = now
	}
	c.uses[sha] = u
	return touch
}

// touch sets the artifact's modification time (its last use, for the next start); its access
// time is left alone.
func (c *Cache) touch(sha string, at time.Time) {
	err := c.root.Chtimes(filepath.Join("sha256", sha), time.Time{}, at)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("artifact cache: recording an artifact's last use on disk; its age may be overstated after a restart", "sha256", sha, "err", err)
	}
}

// acquire counts a response serving the artifact (Prune spares it until release).
func (c *Cache) acquire(sha string) {
	now := c.now()
	c.mu.Lock()
	c.readers[sha]++
	touch := c.useLocked(sha, now)
	c.mu.Unlock()
	if touch {
		c.touch(sha, now)
	}
}

func (c *Cache) release(sha string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readers[sha]--; c.readers[sha] <= 0 {
		delete(c.readers, sha)
	}
}

// scan lists the verified artifacts on disk, their sizes and last uses (modification times).
func (c *Cache) scan() ([]HeldArtifact, error) {
	des, err := fs.ReadDir(c.root.FS(), "sha256")
	if err != nil {
		return nil, fmt.Errorf("listing the cached artifacts: %w", err)
	}
	out := make([]HeldArtifact, 0, len(des))
	var errs []error
	for _, de := range des {
		if !IsSHA256(de.Name()) {
			continue // not ours: left alone, not counted
		}
		fi, err := de.Info()
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("reading cached artifact %s: %w", de.Name(), err))
			continue
		case !fi.Mode().IsRegular():
			continue
		}
		out = append(out, HeldArtifact{SHA256: de.Name(), Bytes: fi.Size(), LastUse: fi.ModTime()})
	}
	return out, errors.Join(errs...)
}

// Prune removes the artifacts PlanPrune picks under the cache's policy (CacheConfig Bound and
// Retain). inUse names the digests referenced now (boot entries, mounted media…): it is asked
// once the prune began, so a reference made before a Fetch of its artifact is either listed or
// followed by a use that spares the artifact. Besides those, an artifact being served, being
// downloaded, or used by a Fetch since the prune began is kept. Referenced artifacts count as
// used now: the retention period runs from when nothing needs an artifact any more. Each
// eviction is logged with its digest, size, last use and reason. When inUse fails nothing is
// removed.
func (c *Cache) Prune(ctx context.Context, inUse func(context.Context) (map[string]bool, error)) (PruneResult, error) {
	c.pruneMu.Lock()
	defer c.pruneMu.Unlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return PruneResult{}, errors.New("pruning the artifact cache: the cache is closed")
	}
	seq0 := c.seq
	c.mu.Unlock()

	refs, err := inUse(ctx)
	if err != nil {
		return PruneResult{}, fmt.Errorf("pruning the artifact cache: listing the artifacts in use: %w", err)
	}
	held, err := c.scan()
	if err != nil {
		// Those listed are still worth pruning: the others stay.
		c.log.WarnContext(ctx, "artifact cache: some artifacts could not be read; they are kept", "err", err)
	}
	now := c.now()
	for i := range held {
		if held[i].LastUse.After(now) {
			// A clock stepped back: the age counts from now.
			c.touch(held[i].SHA256, now)
			held[i].LastUse = now
		}
	}
	pinned := make(map[string]bool, len(refs))
	c.mu.Lock()
	scanned := make(map[string]bool, len(held))
	for _, h := range held {
		scanned[h.SHA256] = true
	}
	for sha := range c.held {
		// Gone from the disk (an operator's rm), unless cached since the scan.
		if !scanned[sha] && c.uses[sha].seq <= seq0 {
			delete(c.held, sha)
		}
	}
	for i := range held {
		h := &held[i]
		c.held[h.SHA256] = h.Bytes
		u, used := c.uses[h.SHA256]
		if used && u.at.After(h.LastUse) {
			h.LastUse = u.at
		}
		if refs[h.SHA256] || c.readers[h.SHA256] > 0 || c.flights[h.SHA256] != nil || (used && u.seq > seq0) {
			pinned[h.SHA256] = true
		}
	}
	c.mu.Unlock()

	plan := PlanPrune(held, pinned, c.policy, now)
	var res PruneResult
	for _, ev := range plan.Evict {
		if err := ctx.Err(); err != nil {
			return c.finishPrune(res, seq0), fmt.Errorf("pruning the artifact cache: %w", err)
		}
		removed, err := c.evict(ev.SHA256, seq0)
		if err != nil {
			c.log.WarnContext(ctx, "artifact cache: evicting an artifact", "sha256", ev.SHA256, "err", err)
		}
		if !removed {
			if err == nil {
				res.Spared++
			}
			continue
		}
		res.Evicted = append(res.Evicted, ev)
		attrs := []any{"sha256", ev.SHA256, "bytes", ev.Bytes, "last_use", ev.LastUse.UTC().Format(time.RFC3339),
			"unused_for", now.Sub(ev.LastUse).Round(time.Second).String(), "reason", string(ev.Reason)}
		switch ev.Reason {
		case EvictUnused:
			attrs = append(attrs, "retain", c.policy.Retain.String())
		case EvictOverBound:
			attrs = append(attrs, "bound_bytes", c.policy.Bound)
		}
		c.log.InfoContext(ctx, "artifact evicted from the cache", attrs...)
	}
	for _, h := range held {
		if refs[h.SHA256] {
			c.use(h.SHA256)
		}
	}
	res.OverBound = plan.OverBound(c.policy)
	c.mu.Lock()
	was := c.overBound
	c.overBound = res.OverBound
	c.mu.Unlock()
	switch {
	case res.OverBound && !was:
		c.log.WarnContext(ctx, "artifact cache: the artifacts in use alone exceed the cache bound; nothing more can be evicted (raise the bound, or free disk space)",
			"in_use_bytes", plan.PinnedBytes, "bound_bytes", c.policy.Bound)
	case !res.OverBound && was:
		c.log.InfoContext(ctx, "artifact cache: back within its bound", "bytes", plan.KeptBytes, "bound_bytes", c.policy.Bound)
	}
	return c.finishPrune(res, seq0), nil
}

// finishPrune forgets the uses of digests no longer held nor in use, and fills in the stats.
func (c *Cache) finishPrune(res PruneResult, seq0 uint64) PruneResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	for sha, u := range c.uses {
		if _, ok := c.held[sha]; !ok && u.seq <= seq0 && c.flights[sha] == nil && c.readers[sha] == 0 {
			delete(c.uses, sha)
		}
	}
	res.Stats = c.statsLocked()
	return res
}

// evict removes the artifact unless it was used since the prune began (seq0), is served or is
// being downloaded: false then. It is moved out of sha256/ under the lock (no Fetch, Has or
// open sees it afterwards) and deleted after; responses already serving it keep reading their
// open file.
func (c *Cache) evict(sha string, seq0 uint64) (bool, error) {
	grave := filepath.Join("tmp", "evicted-"+sha)
	c.mu.Lock()
	if c.closed || c.readers[sha] > 0 || c.flights[sha] != nil || c.uses[sha].seq > seq0 {
		c.mu.Unlock()
		return false, nil
	}
	if err := c.root.Rename(filepath.Join("sha256", sha), grave); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			delete(c.held, sha) // removed by someone else
		}
		c.mu.Unlock()
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("moving artifact %s out of the cache: %w", sha, err)
	}
	c.evictions++
	c.evictedBytes += c.held[sha]
	delete(c.held, sha)
	delete(c.uses, sha)
	c.mu.Unlock()
	if err := c.root.Remove(grave); err != nil {
		// Out of the cache all the same; the next start's sweep of tmp/ removes it.
		return true, fmt.Errorf("deleting evicted artifact %s: %w", sha, err)
	}
	return true, nil
}
