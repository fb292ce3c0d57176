package api

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/console"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/store"
)

// consoleReq is a Console request carrying tok (streams take no unary interceptor).
func consoleReq(tok string, m *bcdv1.ConsoleRequest) *connect.Request[bcdv1.ConsoleRequest] {
	r := connect.NewRequest(m)
	if tok != "" {
		r.Header().Set("Authorization", "Bearer "+tok)
	}
	return r
}

func inputReq(tok, id, data string) *connect.Request[bcdv1.ConsoleInputRequest] {
	r := connect.NewRequest(&bcdv1.ConsoleInputRequest{SessionId: id, Data: []byte(data)})
	r.Header().Set("Authorization", "Bearer "+tok)
	return r
}

// next receives the stream's next message, failing the test at its end.
func next(t *testing.T, s *connect.ServerStreamForClient[bcdv1.ConsoleOutput]) *bcdv1.ConsoleOutput {
	t.Helper()
	if !s.Receive() {
		t.Fatalf("console stream ended: %v", s.Err())
	}
	return s.Msg()
}

// A console session through the API: who may open it, the agent's side attached by the hub
// (as the gateway does), output and input both ways, read-only and ownership refusals, its end
// from the agent, and the two events that record it.
func TestConsoleThroughTheAPI(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, body := e.post(t, enrollPath, e.admin, `{"name":"sol","pool":"default","macs":["52:54:00:00:00:11"],"bmc":{"driver":"ipmi","address":"10.0.0.11:623","username":"root","password":"`+password+`"}}`)
	if code != 200 {
		t.Fatalf("enroll: %d %s", code, body)
	}
	if code, body := e.post(t, enrollPath, e.admin, enrollJSON("rf", "52:54:00:00:00:12")); code != 200 {
		t.Fatalf("enroll: %d %s", code, body)
	}
	otherSecret, _, err := e.svc.CreateToken(ctx, auth.Principal{Name: "admin", Role: auth.Admin}, "ops3", auth.Operator, "")
	if err != nil {
		t.Fatal(err)
	}
	viewer, _, err := e.svc.CreateToken(ctx, auth.Principal{Name: "admin", Role: auth.Admin}, "ro", auth.Viewer, "")
	if err != nil {
		t.Fatal(err)
	}
	nodes := bcdv1connect.NewNodeServiceClient(e.srv.Client(), e.srv.URL)

	// Refusals before anything is queued.
	refusals := []struct {
		name, tok string
		m         *bcdv1.ConsoleRequest
		code      connect.Code
		msg       string
	}{
		{"no token", "", &bcdv1.ConsoleRequest{Node: "sol"}, connect.CodeUnauthenticated, "bearer"},
		{"viewer", viewer, &bcdv1.ConsoleRequest{Node: "sol"}, connect.CodePermissionDenied, "does not allow operate"},
		{"redfish without a console binding", e.admin, &bcdv1.ConsoleRequest{Node: "rf"}, connect.CodeInvalidArgument, "bind console=ipmi"},
		{"too long", e.admin, &bcdv1.ConsoleRequest{Node: "sol", MaxSeconds: 25 * 3600}, connect.CodeInvalidArgument, "1 minute to 24h"},
		{"unknown node", e.admin, &bcdv1.ConsoleRequest{Node: "ghost"}, connect.CodeNotFound, "not found"},
	}
	for _, r := range refusals {
		s, err := nodes.Console(ctx, consoleReq(r.tok, r.m))
		if err == nil {
			for s.Receive() {
				t.Errorf("%s: a refused console sent %v", r.name, s.Msg())
			}
			err = s.Err()
		}
		if connect.CodeOf(err) != r.code || !strings.Contains(err.Error(), r.msg) {
			t.Errorf("%s: %v, want %s containing %q", r.name, err, r.code, r.msg)
		}
	}
	if n, _ := e.st.Commands(ctx, "", 100); len(n) != 0 {
		t.Fatalf("refused consoles queued %d commands", len(n))
	}

	// A session, attached as the gateway attaches a site agent's stream.
	sctx, scancel := context.WithCancel(ctx)
	s, err := nodes.Console(sctx, consoleReq(e.admin, &bcdv1.ConsoleRequest{Node: "sol", Reason: "why it hangs", TakeOver: true}))
	if err != nil {
		t.Fatal(err)
	}
	first := next(t, s)
	id := first.SessionId
	if id == "" || !strings.Contains(first.Status, "waiting for a site agent") {
		t.Fatalf("first message %v", first)
	}
	c, err := e.st.Command(ctx, id)
	if err != nil || c.Kind != "bmc.console" || c.State != "queued" || !strings.Contains(c.Args, `"address":"10.0.0.11:623"`) || !strings.Contains(c.Args, `"takeOver":true`) || strings.Contains(c.Args, password) {
		t.Fatalf("queued command %+v (%v)", c, err)
	}
	end, err := e.hub.Attach(ctx, id, "site-agent-1")
	if err != nil {
		t.Fatal(err)
	}
	if m := next(t, s); !strings.Contains(m.Status, "connected through site agent site-agent-1") {
		t.Fatalf("after attach: %v", m)
	}
	if err := end.Output(ctx, []byte("BdsDxe: loading Boot0001\r\n")); err != nil {
		t.Fatal(err)
	}
	if m := next(t, s); string(m.Data) != "BdsDxe: loading Boot0001\r\n" {
		t.Fatalf("output: %v", m)
	}
	if _, err := nodes.ConsoleInput(ctx, inputReq(e.admin, id, "root\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-end.Input():
		if string(b) != "root\r" {
			t.Fatalf("input reached the agent as %q", b)
		}
	case <-ctx.Done():
		t.Fatal("input never reached the agent")
	}
	inputRefusals := []struct {
		name, tok, id, data string
		code                connect.Code
	}{
		{"another operator's token", otherSecret, id, "x", connect.CodePermissionDenied},
		{"no such session", e.admin, "nope", "x", connect.CodeNotFound},
		{"empty", e.admin, id, "", connect.CodeInvalidArgument},
		{"too large", e.admin, id, strings.Repeat("x", 4097), connect.CodeInvalidArgument},
		{"viewer", viewer, id, "x", connect.CodePermissionDenied},
	}
	for _, r := range inputRefusals {
		if _, err := nodes.ConsoleInput(ctx, inputReq(r.tok, r.id, r.data)); connect.CodeOf(err) != r.code {
			t.Errorf("input, %s: %v, want %s", r.name, err, r.code)
		}
	}
	// The agent's side ends (the BMC took the session away): the operator is told why.
	end.End(errors.New("another client took the console over"))
	if m := next(t, s); !strings.Contains(m.Status, "closed: ") || !strings.Contains(m.Status, "took the console over") {
		t.Fatalf("end: %v", m)
	}
	if s.Receive() || s.Err() != nil {
		t.Fatalf("stream after the end: %v %v", s.Msg(), s.Err())
	}
	scancel()
	if _, err := nodes.ConsoleInput(ctx, inputReq(e.admin, id, "x")); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("input after the end: %v", err)
	}

	// A read-only session takes no input; the operator's leaving closes the agent's side.
	rctx, rcancel := context.WithCancel(ctx)
	rs, err := nodes.Console(rctx, consoleReq(e.admin, &bcdv1.ConsoleRequest{Node: "sol", ReadOnly: true}))
	if err != nil {
		t.Fatal(err)
	}
	rid := next(t, rs).SessionId
	rend, err := e.hub.Attach(ctx, rid, "site-agent-1")
	if err != nil {
		t.Fatal(err)
	}
	next(t, rs)
	if _, err := nodes.ConsoleInput(ctx, inputReq(e.admin, rid, "x")); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("read-only input: %v", err)
	}
	if _, err := e.hub.Attach(ctx, rid, "site-agent-2"); !errors.Is(err, console.ErrAttached) {
		t.Errorf("second attach: %v", err)
	}
	rcancel()
	select {
	case <-rend.Closed():
	case <-ctx.Done():
		t.Fatal("the operator left and the agent's side was never told")
	}

	// A session the operator leaves before any agent took it withdraws its command.
	wctx, wcancel := context.WithCancel(ctx)
	ws, err := nodes.Console(wctx, consoleReq(e.admin, &bcdv1.ConsoleRequest{Node: "sol"}))
	if err != nil {
		t.Fatal(err)
	}
	wid := next(t, ws).SessionId
	wcancel()
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := e.st.Command(ctx, wid)
		if err == nil && c.State == "failed" && strings.Contains(c.Error, "before a site agent took it") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned session's command: %s %q (%v)", c.State, c.Error, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The sessions are recorded: who opened them, why, and how they ended.
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := e.st.Events(ctx, store.EventFilter{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var opened, closed []store.Event
		for _, ev := range evs {
			switch ev.Kind {
			case "node.console":
				opened = append(opened, ev)
			case "node.console.closed":
				closed = append(closed, ev)
			}
		}
		if len(opened) == 3 && len(closed) == 3 {
			if opened[0].Actor != "token:admin" || opened[0].Reason != "why it hangs" {
				t.Errorf("opening event %+v", opened[0])
			}
			var d struct {
				BytesIn, BytesOut int64
				Ended             string
			}
			for _, ev := range closed {
				if ev.Data == "" || !strings.Contains(ev.Data, `"command":"`+id+`"`) {
					continue
				}
				json.Unmarshal([]byte(ev.Data), &d)
				if d.BytesIn != 5 || d.BytesOut != int64(len("BdsDxe: loading Boot0001\r\n")) || !strings.Contains(d.Ended, "took the console over") {
					t.Errorf("closing event %s", ev.Data)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: %d opened, %d closed", len(opened), len(closed))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(e.logs.String(), password) {
		t.Error("password in the logs")
	}
}

// A console open in another token's session is refused, naming who holds it, unless taken over;
// the caller's own session left open is taken over without asking.
func TestConsoleHeldByAnother(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code, body := e.post(t, enrollPath, e.admin, `{"name":"sol","pool":"default","macs":["52:54:00:00:00:21"],"bmc":{"driver":"ipmi","address":"10.0.0.21:623","username":"root","password":"`+password+`"}}`); code != 200 {
		t.Fatalf("enroll: %d %s", code, body)
	}
	ops, _, err := e.svc.CreateToken(ctx, auth.Principal{Name: "admin", Role: auth.Admin}, "ops", auth.Operator, "")
	if err != nil {
		t.Fatal(err)
	}
	nodes := bcdv1connect.NewNodeServiceClient(e.srv.Client(), e.srv.URL)
	open := func(tok string, takeOver bool) (*connect.ServerStreamForClient[bcdv1.ConsoleOutput], error) {
		s, err := nodes.Console(ctx, consoleReq(tok, &bcdv1.ConsoleRequest{Node: "sol", TakeOver: takeOver}))
		if err != nil {
			return nil, err
		}
		if !s.Receive() {
			return nil, s.Err()
		}
		return s, nil
	}
	held, err := open(ops, false)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := open(e.admin, false); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "open already") || !strings.Contains(err.Error(), "token:ops") {
		t.Errorf("a second operator's console while one is open: %v", err)
	}
	own, err := open(ops, false)
	if err != nil {
		t.Errorf("the holder's own second session: %v", err)
	} else {
		own.Close()
	}
	taken, err := open(e.admin, true)
	if err != nil {
		t.Errorf("taking the console over: %v", err)
	} else {
		taken.Close()
	}
}
