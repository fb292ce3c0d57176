package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"bcd/internal/durable"
	"bcd/internal/engine"
	"bcd/internal/store"
)

// ErrRestored: the store is behind what this server last recorded in it (restored from a
// backup, or an older copy) and no restore fence was run since.
var ErrRestored = errors.New("the store was restored from a backup")

// watermarkName is the file in the data dir that keeps the store's watermark as this server
// last recorded it.
const watermarkName = "store.watermark"

// checkWatermark refuses a store that went back from the watermark kept at path: agents may
// have taken commands after that point which the store does not know, and it would send them
// again (to another agent). A missing file, or one of another store, is no objection.
func checkWatermark(ctx context.Context, st *store.Store, path string, log *slog.Logger) error {
	if w, ok, err := st.RestoreWitnessed(ctx); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("agent %s saw this store at fence %d, beat %d, newer than the store: it was restored from an older backup, and no command is sent until "+
			"`bcd store after-restore` is run with the same --store and --data-dir, every server stopped (docs/operations.md, \"Backups and restores\"): %w",
			w.AgentID, w.Seen.Fences, w.Seen.Beats, ErrRestored)
	}
	seen, ok, err := loadWatermark(path)
	if err != nil || !ok {
		return err
	}
	now, err := st.Watermark(ctx)
	if err != nil {
		return err
	}
	if now.Behind(seen) {
		return fmt.Errorf("the store is behind what this server last recorded in it (%s: fence %d, beat %d; the store: fence %d, beat %d). "+
			"Agents may have taken commands after that point that the store does not know, and it would send them again. "+
			"Run `bcd store after-restore` with the same --store and --data-dir before starting the server "+
			"(docs/operations.md, \"Backups and restores\"): %w", path, seen.Fences, seen.Beats, now.Fences, now.Beats, ErrRestored)
	}
	if seen.StoreID != now.StoreID {
		log.Info("the data dir's store watermark is of another store: replaced at the first heartbeat", "file", path)
	}
	return nil
}

// loadWatermark reads the watermark kept at path; ok is false when there is none.
func loadWatermark(path string) (w store.Watermark, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return store.Watermark{}, false, nil
	}
	if err != nil {
		return store.Watermark{}, false, fmt.Errorf("reading the store watermark: %w", err)
	}
	if err := json.Unmarshal(b, &w); err != nil || w.StoreID == "" {
		return store.Watermark{}, false, fmt.Errorf("store watermark %s is not a watermark bcd wrote (expected {\"storeId\":…,\"fences\":N,\"beats\":N}); remove it only if the store is known to be current", path)
	}
	return w, true, nil
}

// watermarkKeeper saves each watermark the engine reports to its file, durably, and logs a
// failure once until saving works again.
type watermarkKeeper struct {
	path string
	log  *slog.Logger

	mu     sync.Mutex
	failed bool
}

func (k *watermarkKeeper) save(w store.Watermark) {
	b, _ := json.Marshal(w)
	err := os.MkdirAll(filepath.Dir(k.path), 0o700)
	if err == nil {
		err = durable.WriteFile(k.path, b, 0o600)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case err != nil && !k.failed:
		k.failed = true
		k.log.Warn("saving the store watermark: a restore of the store will not be noticed at the next start", "file", k.path, "error", err)
	case err == nil && k.failed:
		k.failed = false
		k.log.Info("saving the store watermark works again", "file", k.path)
	}
}

// FenceRestore runs a restore's fence (engine.FenceRestore) on the store cfg names, with no
// server running on it: `bcd store after-restore`. A SQLite store must exist (a mistyped path
// is not a new, empty store to fence).
func FenceRestore(ctx context.Context, cfg Config, reason string) (store.Fenced, error) {
	st, err := OpenStopped(ctx, cfg.WithDefaults(), "restore the backup there first")
	if err != nil {
		return store.Fenced{}, err
	}
	defer st.Close()
	return engine.FenceRestore(ctx, st.Store, st.PeerTimeout, reason)
}
