package webui

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"bcd/internal/auth"
	"bcd/internal/bmc"
	"bcd/internal/console"
	"bcd/internal/metal"
)

// consoleAttachTimeout bounds the wait for a site agent to take a console the page opened.
const consoleAttachTimeout = 2 * time.Minute

// consoleView is the console page's model.
type consoleView struct {
	Node     string // id
	Name     string
	ReadOnly bool
}

// consolePage serves the node's console page: its script opens the stream (the session) and
// posts what is typed. Operator role: a viewer is told so, as the API would.
func (u *UI) consolePage(w http.ResponseWriter, r *http.Request, s session) {
	if u.consoles == nil {
		u.fail(w, r, &s, http.StatusNotFound, "this server relays no consoles (it runs no agent gateway)")
		return
	}
	if err := metal.Require(s.p, auth.Operate); err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	n, err := u.svc.Get(r.Context(), s.p, r.PathValue("ref"))
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	u.render(w, r, http.StatusOK, consolePage(s, consoleView{Node: n.ID, Name: n.Name, ReadOnly: r.URL.Query().Get("readOnly") == "true"}))
}

// sseSender writes a session's side as server-sent events: "session" (the id), "status" (a
// line), "data" (what the machine wrote, base64: it is bytes, not text).
type sseSender struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e sseSender) event(name, data string) error {
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", name, data); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e sseSender) Status(s string) error {
	return e.event("status", strings.NewReplacer("\r", " ", "\n", " ").Replace(s))
}

func (e sseSender) Data(b []byte) error { return e.event("data", base64.StdEncoding.EncodeToString(b)) }

// consoleStream opens a console session on the node and streams it to the page as server-sent
// events until the page goes (which closes the session) or the session ends.
func (u *UI) consoleStream(w http.ResponseWriter, r *http.Request, s session) {
	if u.consoles == nil {
		u.fail(w, r, &s, http.StatusNotFound, "this server relays no consoles (it runs no agent gateway)")
		return
	}
	ctx := r.Context()
	readOnly := r.URL.Query().Get("readOnly") == "true"
	n, cmd, err := u.svc.OpenConsole(ctx, s.p, metal.ConsoleInput{Node: r.PathValue("ref"), Reason: "web UI console", ReadOnly: readOnly, Server: u.consoles.Server()})
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	sess, err := u.consoles.Open(console.Info{ID: cmd.ID, NodeID: n.ID, TenantID: n.TenantID, Owner: s.p.TokenID, ReadOnly: readOnly})
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	opened := time.Now()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no") // a proxy in front must not hold the events back
	w.WriteHeader(http.StatusOK)
	out := sseSender{w: w, rc: http.NewResponseController(w)}
	why := "the page went away"
	if err = out.event("session", cmd.ID); err == nil {
		why, err = sess.Serve(ctx, consoleAttachTimeout, out)
		if errors.Is(err, console.ErrNoAgent) {
			_ = out.Status("closed: no site agent took it within " + consoleAttachTimeout.String() + ": is an agent of the node's site connected?")
		}
	}
	sess.Close()
	in, outBytes := sess.Bytes()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if cerr := u.svc.CloseConsole(cctx, s.p, n, cmd.ID, time.Since(opened), in, outBytes, why); cerr != nil {
		u.log.LogAttrs(cctx, slog.LevelError, "web UI: recording a console session's end", slog.String("node", n.ID), slog.Any("error", cerr))
	}
}

// consoleInput takes what the page typed for a session its operator opened (CSRF-checked by
// authed). It answers 204, or an error text the page shows.
func (u *UI) consoleInput(w http.ResponseWriter, r *http.Request, s session) {
	if u.consoles == nil {
		http.Error(w, "this server relays no consoles", http.StatusNotFound)
		return
	}
	if err := metal.Require(s.p, auth.Operate); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	data := r.PostFormValue("data")
	if len(data) == 0 || len(data) > bmc.MaxConsoleInput {
		http.Error(w, fmt.Sprintf("data: %d bytes; 1-%d are accepted at once", len(data), bmc.MaxConsoleInput), http.StatusBadRequest)
		return
	}
	sess, ok := u.consoles.Lookup(r.PostFormValue("session"))
	if !ok || !s.p.CanSeeTenant(sess.TenantID) || sess.NodeID != r.PathValue("ref") {
		http.Error(w, "no such console session is open on this server", http.StatusNotFound)
		return
	}
	if sess.Owner != s.p.TokenID {
		http.Error(w, "only the session that opened a console types into it", http.StatusForbidden)
		return
	}
	if err := sess.Input(r.Context(), []byte(data)); err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// consoleStreamURL is the page's stream of v. Pure.
func consoleStreamURL(v consoleView) string {
	u := "/ui/nodes/" + v.Node + "/console/stream"
	if v.ReadOnly {
		u += "?readOnly=true"
	}
	return u
}
