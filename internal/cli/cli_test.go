package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/server"
	"bcd/internal/testlog"
)

func startServer(t *testing.T) (url, token string) {
	t.Helper()
	srv := newServer(t)
	return srv.URL(), srv.FirstAdminToken()
}

// newServer runs a server on loopback with a fresh data dir until the test ends.
func newServer(t testing.TB) *server.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", DataDir: t.TempDir()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return srv
}

func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), Env{Args: args, Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

func TestCLIAgainstServer(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw-from-env"}
	code, out, errs := run(t, env, "node", "enroll", "n1", "--bmc-address", "https://10.0.0.2", "--bmc-username", "root", "--mac", "52:54:00:00:00:aa", "--label", "rack=r9")
	if code != 0 || !strings.Contains(out, "enrolling") || strings.Contains(out, "pw-from-env") {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
	code, out, _ = run(t, env, "node", "list", "-o", "json", "--label", "rack=r9")
	var list struct {
		Nodes []struct{ Name, State string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Nodes) != 1 || list.Nodes[0].State != "enrolling" {
		t.Fatalf("list json: %d %q", code, out)
	}
	code, _, errs = run(t, env, "node", "manage", "n1")
	if code != 4 || !strings.Contains(errs, "failed_precondition") || !strings.Contains(errs, "verbs accepted now") {
		t.Fatalf("manage while enrolling: %d %q", code, errs)
	}
	code, _, errs = run(t, env, "node", "deploy", "n1", "--image", "debian")
	if code != 2 || !strings.Contains(errs, "invalid_argument") || !strings.Contains(errs, "bcd image list") {
		t.Fatalf("deploy of an image not in the catalog: %d %q", code, errs)
	}
	code, _, errs = run(t, map[string]string{"BCD_SERVER": url}, "node", "list")
	if code != 5 || !strings.Contains(errs, "BCD_TOKEN") {
		t.Fatalf("no token: %d %q", code, errs)
	}
	code, _, errs = run(t, env, "node", "list", "-o", "yaml")
	if code != 2 || !strings.Contains(errs, "accepted are table and json") {
		t.Fatalf("bad output: %d %q", code, errs)
	}
	// A password on the command line is refused: only a file or the environment.
	code, _, errs = run(t, map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, "node", "enroll", "n2", "--bmc-address", "https://10.0.0.3", "--bmc-username", "root")
	if code != 2 || !strings.Contains(errs, "--bmc-password-file") {
		t.Fatalf("missing password: %d %q", code, errs)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("from-file\n"), 0o600)
	code, out, errs = run(t, map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, "node", "enroll", "n2", "--bmc-driver", "ipmi", "--bmc-address", "10.0.0.3:623", "--bmc-username", "root", "--bmc-password-file", pw)
	if code != 0 || !strings.Contains(out, "ipmi 10.0.0.3:623") {
		t.Fatalf("enroll with password file: %d %q %q", code, out, errs)
	}
	for _, args := range [][]string{{"node", "abort", "n2"}, {"node", "recover", "n2"}, {"node", "events", "n2"}, {"node", "commands", "n2"}, {"site", "create", "nyc", "--label", "dc=nyc"}, {"pool", "create", "gpu", "--site", "nyc"}, {"pool", "list"}, {"token", "create", "ci", "--role", "operator"}, {"token", "list"}, {"token", "whoami"}, {"tenant", "list"}, {"hwprofile", "list"}} {
		if code, out, errs := run(t, env, args...); code != 0 {
			t.Errorf("%v: %d %q %q", args, code, out, errs)
		}
	}
}

func TestEventsFollow(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw"}
	for i := range 6 { // more events than a follower starts with (the newest 10)
		if code, _, errs := run(t, env, "node", "enroll", fmt.Sprintf("f%d", 6-i), "--bmc-address", fmt.Sprintf("https://10.0.0.%d", 9+i), "--bmc-username", "root"); code != 0 {
			t.Fatal(errs)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, Env{Args: []string{"events", "--follow", "-o", "json"}, Getenv: func(k string) string { return env[k] }, Stdout: out, Stderr: io.Discard})
	}()
	waitFor := func(s string) {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), s) {
			if time.Now().After(deadline) {
				t.Fatalf("%q not followed; got:\n%s", s, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor(`"kind":"node.enroll"`)
	if code, _, errs := run(t, env, "node", "abort", "f1", "--reason", "followed"); code != 0 {
		t.Fatal(errs)
	}
	waitFor(`"reason":"followed"`)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("follow exited %d", code)
	}
	if got := out.String(); strings.Contains(got, `"kind":"installation.created"`) {
		t.Errorf("a follower printed the log from its start, not the newest 10 and what came:\n%s", got)
	}
}

// TestEventsByKindAndLast: --kind keeps the events of a kind or a prefix's, --last the newest,
// oldest first; with --follow the newest are the start; bad kinds and --last with --after are
// refused saying what is accepted.
func TestEventsByKindAndLast(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw"}
	for i, n := range []string{"k1", "k2", "k3"} {
		if code, _, errs := run(t, env, "node", "enroll", n, "--bmc-address", fmt.Sprintf("https://10.0.1.%d", i+1), "--bmc-username", "root"); code != 0 {
			t.Fatal(errs)
		}
	}
	if code, _, errs := run(t, env, "node", "abort", "k2", "--reason", "by hand"); code != 0 {
		t.Fatal(errs)
	}
	code, list, errs := run(t, env, "node", "list", "-o", "json")
	var nodes struct{ Nodes []struct{ Id, Name string } }
	if code != 0 || json.Unmarshal([]byte(list), &nodes) != nil {
		t.Fatalf("node list: %d %q %q", code, list, errs)
	}
	name := map[string]string{}
	for _, n := range nodes.Nodes {
		name[n.Id] = n.Name
	}
	// listed runs bcd events with args and returns each event's kind and node's name.
	listed := func(args ...string) []string {
		t.Helper()
		code, out, errs := run(t, env, append([]string{"events", "-o", "json"}, args...)...)
		var resp struct {
			Events []struct{ Kind, Node string }
		}
		if code != 0 || json.Unmarshal([]byte(out), &resp) != nil {
			t.Fatalf("events %v: %d %q %q", args, code, out, errs)
		}
		var got []string
		for _, e := range resp.Events {
			got = append(got, e.Kind+" "+name[e.Node])
		}
		return got
	}
	if got := listed("--kind", "node.enroll"); !slices.Equal(got, []string{"node.enroll k1", "node.enroll k2", "node.enroll k3"}) {
		t.Errorf("--kind node.enroll: %v", got)
	}
	if got := listed("--last", "2", "--kind", "node.enroll"); !slices.Equal(got, []string{"node.enroll k2", "node.enroll k3"}) {
		t.Errorf("--last 2 --kind node.enroll: %v", got)
	}
	all := listed()
	if got := listed("--last", "1"); len(got) != 1 || got[0] != all[len(all)-1] {
		t.Errorf("--last 1: %v, want the newest of %v", got, all)
	}
	for _, got := range [][]string{listed("--kind", "node.*"), listed("--kind", "workflow.*,node.enroll"), listed("k2", "--kind", "node.*")} {
		if len(got) == 0 {
			t.Errorf("a listing by prefix found nothing")
		}
		for _, k := range got {
			if !strings.HasPrefix(k, "node.") && !strings.HasPrefix(k, "workflow.") {
				t.Errorf("listing by prefix: %q", k)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kind", "Node.Fail"}, "lowercase letters, digits and _ in parts joined by dots (node.fail)"},
		{[]string{"--kind", "node.f*"}, "a prefix ends in .*"},
		{[]string{"--last", "2", "--after", "1"}, "--last and --after: give one"},
		{[]string{"--last", "0"}, "1 or more"},
		{[]string{"--follow", "--after", "3"}, "--after with --follow: a follower starts at the newest events"},
	} {
		if code, _, errs := run(t, env, append([]string{"events"}, c.args...)...); code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("events %v: %d %q: want exit 2 and %q", c.args, code, errs, c.want)
		}
	}
	// Following from the newest enrolment: k3's, then k4's; never k1's or k2's.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, Env{Args: []string{"events", "--follow", "--last", "1", "--kind", "node.enroll", "-o", "json"}, Getenv: func(k string) string { return env[k] }, Stdout: out, Stderr: io.Discard})
	}()
	waitFor := func(s string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), s); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%q not followed; got:\n%s", s, out.String())
			}
		}
	}
	waitFor(`10.0.1.3`)
	if code, _, errs := run(t, env, "node", "enroll", "k4", "--bmc-address", "https://10.0.1.4", "--bmc-username", "root"); code != 0 {
		t.Fatal(errs)
	}
	waitFor(`10.0.1.4`)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("follow exited %d", code)
	}
	if got := out.String(); strings.Contains(got, `10.0.1.1`) || strings.Contains(got, `10.0.1.2`) || strings.Contains(got, "workflow.") {
		t.Errorf("following from the newest enrolment printed older or other events:\n%s", got)
	}
}

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

func TestImageCatalogCLI(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	prefix := filepath.Join(t.TempDir(), "lab")
	for _, args := range [][]string{
		{"signer", "keygen", "--out", prefix},
		{"signer", "add", "lab", "--public-key-file", prefix + ".pub"},
		{"image", "add", "debian", "--url", "http://10.0.0.1/d.raw.zst", "--size", "100", "--compression", "zstd", "--sha256", strings.Repeat("c", 64), "--signer", "lab", "--sign-key", prefix + ".key"},
		{"image", "add", "unsigned", "--url", "http://10.0.0.1/u.raw", "--sha256", strings.Repeat("d", 64)},
	} {
		if code, out, errs := run(t, env, args...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errs)
		}
	}
	code, out, _ := run(t, env, "image", "list")
	if code != 0 || !strings.Contains(out, "deployable") || !strings.Contains(out, "REFUSED: unsigned: image is not signed") {
		t.Fatalf("image list:\n%s", out)
	}
	if code, _, _ := run(t, env, "signer", "revoke", "lab"); code != 0 {
		t.Fatal("revoke failed")
	}
	_, out, _ = run(t, env, "image", "list")
	if !strings.Contains(out, "revoked") {
		t.Fatalf("after revocation:\n%s", out)
	}
}
