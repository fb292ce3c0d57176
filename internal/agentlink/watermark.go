package agentlink

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"bcd/internal/durable"
	agentv1 "bcd/internal/gen/agentv1"
)

// WatermarkFile keeps, in DataDir, the newest watermark of the control plane's store the
// gateway told the agent (store.Watermark).
const WatermarkFile = "store.watermark"

// storeMark is a store's watermark as the agent keeps it: the agent is a witness of how far
// the store had come. A control plane whose store is behind it (restored from an older backup
// onto a new host, with no fence run) refuses the agent and sends no command until an operator
// runs the fence: commands queued in the backup may have run since.
type storeMark struct {
	StoreID string `json:"storeId"`
	Fences  int64  `json:"fences"`
	Beats   int64  `json:"beats"`
}

// newer says whether w replaces cur as the newest watermark the agent saw: another store (the
// agent was moved to another control plane, or the store made anew), or the same store at a
// later fence or with more beats since the same fence. Pure.
func (w storeMark) newer(cur storeMark) bool {
	switch {
	case w.StoreID == "":
		return false
	case w.StoreID != cur.StoreID:
		return true
	}
	return w.Fences > cur.Fences || w.Fences == cur.Fences && w.Beats > cur.Beats
}

func markOf(m *agentv1.StoreWatermark) storeMark {
	return storeMark{StoreID: m.GetStoreId(), Fences: m.GetFences(), Beats: m.GetBeats()}
}

func (w storeMark) proto() *agentv1.StoreWatermark {
	if w.StoreID == "" {
		return nil
	}
	return &agentv1.StoreWatermark{StoreId: w.StoreID, Fences: w.Fences, Beats: w.Beats}
}

// loadMark reads the watermark kept in dir. A missing file is none; an unreadable one is
// logged and taken as none (the agent loses its witness, not its work).
func loadMark(dir string, log *slog.Logger) storeMark {
	if dir == "" {
		return storeMark{}
	}
	path := filepath.Join(dir, WatermarkFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return storeMark{}
	}
	var w storeMark
	if err == nil {
		err = json.Unmarshal(b, &w)
	}
	if err != nil {
		log.Warn("the kept store watermark cannot be read: starting without one (a restore of the control plane's store made before this start is not noticed by this agent)",
			"file", path, "error", err)
		return storeMark{}
	}
	return w
}

// saw keeps m if it is newer than the agent's watermark, in DataDir too.
func (l *Link) saw(m *agentv1.StoreWatermark) {
	w := markOf(m)
	cur := l.mark.Load()
	if !w.newer(*cur) || !l.mark.CompareAndSwap(cur, &w) {
		return
	}
	if l.cfg.DataDir == "" {
		return
	}
	b, _ := json.Marshal(w)
	if err := durable.WriteFile(filepath.Join(l.cfg.DataDir, WatermarkFile), b, 0o600); err != nil {
		if !l.markFailed.Swap(true) {
			l.log.LogAttrs(l.ctx, slog.LevelWarn, "keeping the store watermark", slog.Any("error", fmt.Errorf("writing %s: %w", WatermarkFile, err)))
		}
		return
	}
	l.markFailed.Store(false)
}

// resumeAfter is what the agent's Hello names as the last command it received: the journal's
// last, when it came from the store and fence of mark, the watermark the Hello names. A store at
// that fence that does not have it was restored from a backup taken before it was sent, however
// shortly before (the watermark's beats tell a restore only from a backup older than the last
// beat the agent was told). Commands from another store, or from before a fence, are not named.
func resumeAfter(mark storeMark, j *journal) string {
	id, from := j.last()
	if mark.StoreID == "" || from.StoreID != mark.StoreID || from.Fences != mark.Fences {
		return ""
	}
	return id
}
