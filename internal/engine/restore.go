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

// watermark keeps the store's watermark for agents (Watermark) and tells Config.Watermarks.
func (e *Engine) watermark(w store.Watermark) {
	e.mark.Store(&w)
	if e.cfg.Watermarks != nil {
		e.cfg.Watermarks(w)
	}
}

// Watermark is the store's watermark as this server last counted a beat in it (false before
// its first heartbeat): the gateway tells it to the agents, which keep the newest and name it
// when they connect (Witness).
func (e *Engine) Watermark() (store.Watermark, bool) {
	w := e.mark.Load()
	if w == nil {
		return store.Watermark{}, false
	}
	return *w, true
}

// ErrStoreBehind: an agent saw a newer watermark of the store than the store has (Witness).
var ErrStoreBehind = errors.New("the store is behind what an agent saw of it")

// Witness checks an arriving agent against seen, the newest watermark of this store it was told
// (empty: none), and last, the last command it received from this store at seen's fence (empty:
// none). A store behind seen, or at seen's fence without last, was restored from a backup older
// than what the agent saw, with no fence run since: a restore onto a new host, where no server
// kept a watermark (checkWatermark in the server), or a PostgreSQL failed over to a standby that
// had not received the last commits. Its queued commands may have been taken by agents after the
// backup, and sending them would run them a second time; the steps that sent what it lost would
// send it again. The first such agent is recorded (store.Tx.WitnessRestore, a
// control_plane.restore_witnessed event), every server stops sending commands (Claim; the others
// learn it at their next heartbeat) until an operator stops them and runs the fence (bcd store
// after-restore, which clears it), and the agent is refused with ErrStoreBehind.
//
// Commands are never deleted, so a command the store does not have is one it lost. The beats
// tell a restore from a backup older than the last beat the agent was told (one every
// heartbeat); the last command tells one from a backup taken before the last command the agent
// took, however shortly before.
//
// Only site agents are witnesses: they run on the operator's hosts. A node's agents (its
// ramdisk, whose key a kexec leaves in the lessee's memory, and its installed OS) are not told
// the watermark, and what they name is ignored: a lessee could otherwise stop the control plane.
func (e *Engine) Witness(ctx context.Context, a Agent, seen store.Watermark, last string) error {
	if seen.StoreID == "" || a.Kind != "site" {
		return nil
	}
	now, err := e.st.Watermark(ctx)
	if err != nil {
		return err
	}
	w := store.RestoreWitness{AgentID: a.ID, Seen: seen}
	var why string
	switch {
	case now.Behind(seen):
		why = fmt.Sprintf("agent %s saw this store at fence %d, beat %d, and the store is at fence %d, beat %d", a.ID, seen.Fences, seen.Beats, now.Fences, now.Beats)
	case last != "" && seen.StoreID == now.StoreID && seen.Fences == now.Fences:
		if _, err := e.st.Command(ctx, last); !errors.Is(err, store.ErrNotFound) {
			return err // known (nil), or the store could not tell
		}
		w.Command = last
		why = fmt.Sprintf("agent %s took command %s from this store at fence %d, and the store does not have it", a.ID, last, now.Fences)
	default:
		return nil
	}
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		w.At = tx.At()
		first, err := tx.WitnessRestore(ctx, w)
		if err != nil || !first {
			return err
		}
		data, _ := json.Marshal(map[string]any{"agent": a.ID, "kind": a.Kind, "site": a.SiteID, "node": a.NodeID, "seen": seen, "store": now, "command": last})
		return tx.AppendEvent(ctx, store.Event{NodeID: a.NodeID, Actor: "gateway", Kind: "control_plane.restore_witnessed", Data: string(data),
			Reason: why + ": it was restored from an older backup with no fence run; " +
				"no command is sent until the servers are stopped and bcd store after-restore is run"})
	})
	if err != nil {
		return fmt.Errorf("recording that agent %s saw a newer store: %w", a.ID, err)
	}
	e.witnessed(ctx, w)
	return fmt.Errorf("%s: the control plane's store was restored from an older backup "+
		"and no restore fence was run; it sends no command until an operator stops its servers and runs `bcd store after-restore`: %w",
		why, ErrStoreBehind)
}

// witnessed stops this server sending commands: an agent showed the store was restored.
func (e *Engine) witnessed(ctx context.Context, w store.RestoreWitness) {
	if e.restored.CompareAndSwap(nil, &w) {
		e.log.LogAttrs(ctx, slog.LevelError, "an agent saw a newer store than the store is: it was restored from an older backup, and no command is sent until the servers are stopped and `bcd store after-restore` is run",
			slog.String("agent", w.AgentID), slog.Int64("seen_fences", w.Seen.Fences), slog.Int64("seen_beats", w.Seen.Beats), slog.String("command", w.Command))
	}
}

// sending says whether this server sends commands: not once an agent witnessed the store's
// restore (Witness).
func (e *Engine) sending() bool { return e.restored.Load() == nil }

// maxUnknownSeen bounds the unknown commands a server remembers having recorded.
const maxUnknownSeen = 4096

// noteUnknown records that agent a named, as what it did with them, commands the store does not
// know. Commands are never deleted, and an agent learns of a command only from the store: the
// store forgot them, which is what a restore from a backup taken before a's work does. A
// control_plane.unknown_command event and a warning say so, once per agent and command; the
// store is not changed (the fence is the operator's: bcd store after-restore).
func (e *Engine) noteUnknown(ctx context.Context, a Agent, what string, ids []string) {
	if a.Kind != "site" {
		// A node's agents may be a lessee's (the installed OS, a kexec'd ramdisk's key): what
		// they name is refused, and not taken as evidence of a restore.
		return
	}
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

// checkWitnessed stops this server sending commands once another server recorded an agent's
// witness of the store's restore (Heartbeat), and says every minute that it does not send.
func (e *Engine) checkWitnessed(ctx context.Context) {
	if e.sending() {
		w, ok, err := e.st.RestoreWitnessed(ctx)
		if err != nil {
			e.log.Warn("reading whether an agent witnessed a restore of the store", "error", err)
			return
		}
		if ok {
			e.witnessed(ctx, w)
		}
		return
	}
	last, now := e.witnessWarned.Load(), time.Now().UnixNano()
	if now-last >= int64(time.Minute) && e.witnessWarned.CompareAndSwap(last, now) {
		w := e.restored.Load()
		e.log.LogAttrs(ctx, slog.LevelError, "sending no commands: the store was restored from an older backup (an agent saw a newer one); stop the servers and run `bcd store after-restore`",
			slog.String("agent", w.AgentID), slog.Int64("seen_fences", w.Seen.Fences), slog.Int64("seen_beats", w.Seen.Beats))
	}
}
