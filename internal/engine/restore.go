package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"bcd/internal/store"
)

// ErrServersAlive: a restore's fence was refused because a server is still running on the store.
var ErrServersAlive = errors.New("servers are alive on the store")

// FenceRestore makes a store restored from a backup safe to serve from (bcd store
// after-restore), before any server starts on it: the agents did not forget what they did after
// the backup. Commands still queued are lost (never sent to another agent; their steps decide),
// unused one-time join tokens are void, and the fence is counted so that the servers' watermarks
// from before it no longer stop them (store.Tx.FenceRestore). It records a
// control_plane.restore_fenced event naming reason.
//
// It refuses while a server recorded that it is alive within peerTimeout (the servers' own
// PeerTimeout; 0: no check, for a caller that knows no server runs, such as the holder of a
// SQLite store's lock): a running server would go on handing out commands the fence is about
// to lose.
func FenceRestore(ctx context.Context, st *store.Store, peerTimeout time.Duration, reason string) (store.Fenced, error) {
	var f store.Fenced
	err := st.Write(ctx, func(tx *store.Tx) error {
		var alive []string
		var err error
		if peerTimeout > 0 {
			if alive, err = tx.ServersAliveSince(ctx, tx.At()-peerTimeout.Microseconds()); err != nil {
				return err
			}
		}
		if len(alive) > 0 {
			return fmt.Errorf("server %s recorded that it was alive within the last %s: stop every server on the store first (a server that was killed counts as alive until %s after its last heartbeat): %w",
				strings.Join(alive, ", "), peerTimeout, peerTimeout, ErrServersAlive)
		}
		if f, err = tx.FenceRestore(ctx); err != nil {
			return err
		}
		if reason == "" {
			reason = "the store was restored from a backup"
		}
		data, _ := json.Marshal(map[string]any{"commandsLost": f.Commands, "tokensVoid": f.Tokens, "nodes": len(f.Nodes), "fences": f.Watermark.Fences})
		return tx.AppendEvent(ctx, store.Event{Actor: "operator", Kind: "control_plane.restore_fenced", Data: string(data),
			Reason: reason + ": queued commands lost (never sent), unused join tokens void"})
	})
	if err != nil {
		return store.Fenced{}, fmt.Errorf("fencing the restored store: %w", err)
	}
	return f, nil
}

// watermark tells Config.Watermarks the store's watermark.
func (e *Engine) watermark(w store.Watermark) {
	if e.cfg.Watermarks != nil {
		e.cfg.Watermarks(w)
	}
}

// maxUnknownSeen bounds the unknown commands a server remembers having recorded.
const maxUnknownSeen = 4096

// noteUnknown records that agent a named, as what it did with them, commands the store does not
// know. Commands are never deleted, and an agent learns of a command only from the store: the
// store forgot them, which is what a restore from a backup taken before a's work does. A
// control_plane.unknown_command event and a warning say so, once per agent and command; the
// store is not changed (the fence is the operator's: bcd store after-restore).
func (e *Engine) noteUnknown(ctx context.Context, a Agent, what string, ids []string) {
	var fresh []string
	for _, id := range ids {
		if _, seen := e.unknownSeen.Get(a.ID + "|" + id); !seen && len(fresh) < 64 {
			fresh = append(fresh, id)
		}
	}
	if len(fresh) == 0 {
		return
	}
	e.log.LogAttrs(ctx, slog.LevelWarn, "an agent named commands the store does not know: the store was restored from a backup taken before they were sent (run bcd store after-restore if it was not)",
		slog.String("agent", a.ID), slog.String("what", what), slog.Any("commands", fresh))
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		data, _ := json.Marshal(map[string]any{"agent": a.ID, "kind": a.Kind, "site": a.SiteID, "node": a.NodeID, "commands": fresh, "what": what})
		return tx.AppendEvent(ctx, store.Event{NodeID: a.NodeID, Actor: "gateway", Kind: "control_plane.unknown_command", Data: string(data),
			Reason: fmt.Sprintf("agent %s %s %d command(s) the store does not know: the store was restored from a backup taken before they were sent; "+
				"without bcd store after-restore, commands queued in the backup may be sent to a second agent", a.ID, what, len(fresh))})
	})
	if err != nil {
		e.log.Warn("recording commands unknown to the store", "agent", a.ID, "error", err)
		return
	}
	for _, id := range fresh {
		e.unknownSeen.Put(a.ID+"|"+id, true)
	}
}
