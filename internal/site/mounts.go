package site

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"bcd/internal/durable"
	"bcd/internal/netboot"
)

// MountsFile keeps, in the data dir, the ISO each node's BMC was given as virtual media.
const MountsFile = "media-mounts.json"

// mountRecord is an ISO a node's virtual media may read from the artifact cache.
type mountRecord struct {
	Name  string    `json:"name"`
	Since time.Time `json:"since"`
}

// mediaMounts is, per node, the ISOs its BMC may read as virtual media (by their URL into the
// artifact cache): the one inserted, and any whose replacement failed half-way (the BMC's state
// is then unknown). A BMC reads an ISO in ranges, on demand, for as long as it stays inserted,
// so the cache keeps these until an eject or a successful insert of another. Persisted (JSON,
// replaced atomically) so that a restarted agent still keeps them. Safe for concurrent use.
type mediaMounts struct {
	path string // "" keeps the table in memory

	mu sync.Mutex
	m  map[string]map[string]mountRecord // node → sha256 → mount
}

// openMediaMounts loads the table from dir; dir "" keeps it in memory.
func openMediaMounts(dir string) (*mediaMounts, error) {
	mm := &mediaMounts{m: map[string]map[string]mountRecord{}}
	if dir == "" {
		return mm, nil
	}
	mm.path = filepath.Join(dir, MountsFile)
	b, err := os.ReadFile(mm.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return mm, nil
	case err != nil:
		return nil, fmt.Errorf("opening the media mounts: %w", err)
	}
	if err := json.Unmarshal(b, &mm.m); err != nil {
		return nil, fmt.Errorf("opening the media mounts: %s is not valid JSON: %w", mm.path, err)
	}
	if mm.m == nil {
		mm.m = map[string]map[string]mountRecord{}
	}
	return mm, nil
}

// Add records that node's virtual media may read art (before the agent fetches it and hands
// it to the BMC); false when it was recorded already.
func (mm *mediaMounts) Add(nodeID string, art netboot.Artifact, at time.Time) (bool, error) {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	if _, ok := mm.m[nodeID][art.SHA256]; ok {
		return false, nil
	}
	old := mm.cloneLocked()
	if mm.m[nodeID] == nil {
		mm.m[nodeID] = map[string]mountRecord{}
	}
	mm.m[nodeID][art.SHA256] = mountRecord{Name: art.Name, Since: at.UTC()}
	return true, mm.commitLocked(old, "recording the virtual media of node "+nodeID)
}

// Drop forgets one ISO of node (never handed to the BMC).
func (mm *mediaMounts) Drop(nodeID, sha string) error {
	return mm.change(nodeID, func(set map[string]mountRecord) { delete(set, sha) }, "forgetting an ISO of node "+nodeID)
}

// Only keeps sha alone for node (its BMC took it: what it had before is gone).
func (mm *mediaMounts) Only(nodeID, sha string) error {
	return mm.change(nodeID, func(set map[string]mountRecord) {
		for k := range set {
			if k != sha {
				delete(set, k)
			}
		}
	}, "recording the virtual media of node "+nodeID)
}

// Clear forgets node's virtual media (ejected).
func (mm *mediaMounts) Clear(nodeID string) error {
	return mm.change(nodeID, func(set map[string]mountRecord) { clear(set) }, "forgetting the virtual media of node "+nodeID)
}

func (mm *mediaMounts) change(nodeID string, f func(map[string]mountRecord), what string) error {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	set, ok := mm.m[nodeID]
	if !ok {
		return nil
	}
	old := mm.cloneLocked()
	f(set)
	if len(set) == 0 {
		delete(mm.m, nodeID)
	}
	return mm.commitLocked(old, what)
}

// AddDigests adds the digests of the ISOs the BMCs may read to set.
func (mm *mediaMounts) AddDigests(set map[string]bool) {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	for _, s := range mm.m {
		for sha := range s {
			set[sha] = true
		}
	}
}

func (mm *mediaMounts) cloneLocked() map[string]map[string]mountRecord {
	c := make(map[string]map[string]mountRecord, len(mm.m))
	for k, v := range mm.m {
		c[k] = maps.Clone(v)
	}
	return c
}

// commitLocked saves the table; on failure it puts old back.
func (mm *mediaMounts) commitLocked(old map[string]map[string]mountRecord, what string) error {
	if mm.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(mm.m, "", "  ")
	if err == nil {
		err = durable.WriteFile(mm.path, b, 0o600)
	}
	if err != nil {
		mm.m = old
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
