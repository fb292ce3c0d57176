package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"bcd/internal/console"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/metal"
	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

const password = "Very-Secret-BMC-Password-42"

type env struct {
	srv   *httptest.Server
	admin string
	logs  *bytes.Buffer
	st    *store.Store
	svc   *metal.Service
	hub   *console.Hub
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvServing(t, nil)
}

// newEnvServing is newEnv with joiner as the agent gateway (nil: none).
func newEnvServing(t testing.TB, joiner SiteJoiner) *env {
	t.Helper()
	st := storetest.Open(t, store.SQLite)
	sealer, _ := secrets.NewSealer(bytes.Repeat([]byte{9}, secrets.KeySize))
	logs := &bytes.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc := metal.New(st, sealer, log)
	tok, err := svc.Bootstrap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hub := console.NewHub("")
	srv := httptest.NewServer(Handler(svc, joiner, nil, hub, log))
	t.Cleanup(srv.Close)
	return &env{srv: srv, admin: tok, logs: logs, st: st, svc: svc, hub: hub}
}

// post sends a raw JSON request and returns the status and body.
func (e *env) post(t testing.TB, path, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const enrollPath = "/bcd.v1.NodeService/Enroll"

func enrollJSON(name, mac string) string {
	return `{"name":"` + name + `","pool":"default","macs":["` + mac + `"],"bmc":{"address":"https://10.0.0.9","username":"root","password":"` + password + `"}}`
}

func TestJSONOverHTTP(t *testing.T) {
	e := newEnv(t)
	code, body := e.post(t, enrollPath, e.admin, enrollJSON("n1", "52:54:00:00:00:01"))
	if code != 200 || !strings.Contains(body, `"state":"enrolling"`) {
		t.Fatalf("enroll: %d %s", code, body)
	}
	if strings.Contains(body, password) || !strings.Contains(body, "secret://") {
		t.Fatalf("enroll response must carry references, never the password: %s", body)
	}
	cases := []struct {
		name, path, token, body string
		status                  int
		code                    string
		msg                     string
	}{
		{"no token", enrollPath, "", enrollJSON("n2", "52:54:00:00:00:02"), 401, "unauthenticated", "missing bearer token"},
		{"bad token", enrollPath, "bcda_nope", enrollJSON("n2", "52:54:00:00:00:02"), 401, "unauthenticated", "unknown or revoked"},
		{"malformed json", enrollPath, e.admin, `{"name":`, 400, "invalid_argument", "invalid JSON"},
		{"unknown field", enrollPath, e.admin, `{"name":"n2","pool":"default","colour":"red"}`, 400, "invalid_argument", "colour"},
		{"wrong type", enrollPath, e.admin, `{"name":42}`, 400, "invalid_argument", "invalid JSON"},
		{"bad mac", enrollPath, e.admin, enrollJSON("n2", "nope"), 400, "invalid_argument", "not an Ethernet MAC"},
		{"duplicate name", enrollPath, e.admin, enrollJSON("n1", "52:54:00:00:00:03"), 409, "already_exists", "already exists"},
		{"duplicate mac", enrollPath, e.admin, enrollJSON("n3", "52:54:00:00:00:01"), 409, "already_exists", "already belongs"},
		{"wrong state", "/bcd.v1.NodeService/Manage", e.admin, `{"node":"n1"}`, 400, "failed_precondition", "verbs accepted now: abort, maintenance"},
		{"not found", "/bcd.v1.NodeService/Get", e.admin, `{"node":"ghost"}`, 404, "not_found", "not found"},
		{"oversized", enrollPath, e.admin, `{"name":"` + strings.Repeat("x", MaxRequestBytes) + `"}`, 429, "resource_exhausted", ""},
	}
	for _, c := range cases {
		code, body := e.post(t, c.path, c.token, c.body)
		var got struct{ Code, Message string }
		json.Unmarshal([]byte(body), &got)
		if code != c.status || got.Code != c.code || !strings.Contains(got.Message, c.msg) {
			t.Errorf("%s: %d %s, want %d %s containing %q", c.name, code, body, c.status, c.code, c.msg)
		}
		if strings.Contains(body, password) {
			t.Errorf("%s: response leaks the password", c.name)
		}
	}
	// Nothing refused changed the store: one node, one enroll event.
	nodes, err := e.st.Nodes(context.Background(), store.NodeFilter{Limit: 10})
	evs, _ := e.st.Events(context.Background(), store.EventFilter{Limit: 100})
	if err != nil || len(nodes) != 1 || evs[len(evs)-1].Kind != "node.enroll" {
		t.Errorf("refused requests changed the store: %d nodes, last event %s (%v)", len(nodes), evs[len(evs)-1].Kind, err)
	}
	dump, _ := e.st.Dump(context.Background())
	if strings.Contains(dump, password) || strings.Contains(e.logs.String(), password) {
		t.Error("password found in the database or the logs")
	}
}

func TestRolesOverGRPC(t *testing.T) {
	e := newEnv(t)
	hc := e.srv.Client()
	client := func(tok string) (bcdv1connect.NodeServiceClient, bcdv1connect.TokenServiceClient) {
		opt := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
				r.Header().Set("Authorization", "Bearer "+tok)
				return next(ctx, r)
			}
		}))
		return bcdv1connect.NewNodeServiceClient(hc, e.srv.URL, opt, connect.WithGRPC()), bcdv1connect.NewTokenServiceClient(hc, e.srv.URL, opt)
	}
	ctx := context.Background()
	_, adminTokens := client(e.admin)
	viewer, err := adminTokens.Create(ctx, connect.NewRequest(&bcdv1.CreateTokenRequest{Name: "ro", Role: "viewer"}))
	if err != nil {
		t.Fatal(err)
	}
	vNodes, _ := client(viewer.Msg.Secret)
	_, err = vNodes.Enroll(ctx, connect.NewRequest(&bcdv1.EnrollRequest{Name: "x", Pool: "default"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("viewer enroll over gRPC: %v", err)
	}
	if _, err := vNodes.List(ctx, connect.NewRequest(&bcdv1.ListNodesRequest{})); err != nil {
		t.Fatalf("viewer list: %v", err)
	}
	if _, err := adminTokens.Revoke(ctx, connect.NewRequest(&bcdv1.RevokeTokenRequest{Token: "ro"})); err != nil {
		t.Fatal(err)
	}
	var ce *connect.Error
	_, err = adminTokens.Create(ctx, connect.NewRequest(&bcdv1.CreateTokenRequest{Name: "bad name", Role: "viewer"}))
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		t.Fatalf("bad token name: %v", err)
	}
}

// FuzzEnrollDecoding feeds arbitrary bodies to the enroll endpoint: the server must answer
// every one with a well-formed response and never panic or leak.
func FuzzEnrollDecoding(f *testing.F) {
	f.Add(enrollJSON("n1", "52:54:00:00:00:01"))
	f.Add(`{"name":"a","pool":"default","bmc":{"address":"10.0.0.1:623","driver":"ipmi","username":"u","password":"p"}}`)
	f.Add(`{"labels":{"a":"b"},"macs":[]}`)
	f.Add(`{"name":"\u0000"}`)
	f.Add(`[]`)
	f.Add(`{"bmc":null}`)
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, body string) {
		code, resp := e.post(t, enrollPath, e.admin, body)
		if code != 200 {
			var got struct{ Code, Message string }
			if err := json.Unmarshal([]byte(resp), &got); err != nil || got.Code == "" || got.Code == "internal" || got.Code == "unknown" {
				t.Fatalf("body %q: status %d, answer %q", body, code, resp)
			}
		}
	})
}
