package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bcd/internal/api"
	"bcd/internal/console"
	"bcd/internal/metal"
	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/testlog"
)

// `bcd node console` against the API, the site agent's side played through the hub: the status
// lines on stderr, the machine's output on stdout, typed input through the escape filter (~~ sends
// one ~) to the agent, ~. leaving with exit 0 and the session closed for the agent.
func TestNodeConsoleCommand(t *testing.T) {
	st := storetest.Open(t, store.SQLite)
	sealer, _ := secrets.NewSealer(bytes.Repeat([]byte{7}, secrets.KeySize))
	log := slog.New(slog.DiscardHandler)
	svc := metal.New(st, sealer, log)
	tok, err := svc.Bootstrap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hub := console.NewHub("")
	srv := httptest.NewServer(api.Handler(svc, nil, nil, hub, log))
	t.Cleanup(srv.Close)
	env := map[string]string{"BCD_SERVER": srv.URL, "BCD_TOKEN": tok, "BCD_BMC_PASSWORD": "pw"}
	if code, out, errs := run(t, env, "node", "enroll", "sol1", "--bmc-driver", "ipmi", "--bmc-address", "10.0.0.7:623", "--bmc-username", "root", "--mac", "52:54:00:00:00:c1"); code != 0 {
		t.Fatalf("enroll: %d %s %s", code, out, errs)
	}

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(context.Background(), Env{Args: []string{"node", "console", "sol1", "--reason", "test"}, Getenv: func(k string) string { return env[k] },
			Stdout: stdout, Stderr: stderr, Stdin: stdinR})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var id string
	for id == "" {
		if ids := hub.IDs(); len(ids) == 1 {
			id = ids[0]
		} else if ctx.Err() != nil {
			t.Fatalf("no session opened (stderr %q)", stderr.String())
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	end, err := hub.Attach(ctx, id, "agent-7")
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, s *testlog.Buffer, want string) {
		t.Helper()
		for !strings.Contains(s.String(), want) {
			if ctx.Err() != nil {
				t.Fatalf("%s: %q, want %q", what, s.String(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("stderr", stderr, "connected through site agent agent-7")
	if err := end.Output(ctx, []byte("sol1 login: ")); err != nil {
		t.Fatal(err)
	}
	waitFor("stdout", stdout, "sol1 login: ")
	io.WriteString(stdinW, "~~root\r")
	var typed string
	for !strings.Contains(typed, "\r") {
		select {
		case b := <-end.Input():
			typed += string(b)
		case <-ctx.Done():
			t.Fatalf("typed %q so far", typed)
		}
	}
	if typed != "~root\r" {
		t.Errorf("the agent got %q, want ~root\\r", typed)
	}
	io.WriteString(stdinW, "~.")
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(stderr.String(), "left the console") {
			t.Errorf("exit %d, stderr %q", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("~. did not leave")
	}
	select {
	case <-end.Closed():
	case <-ctx.Done():
		t.Fatal("the session was not closed for the agent")
	}
}
