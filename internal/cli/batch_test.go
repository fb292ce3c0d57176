package cli

import (
	"regexp"
	"strings"
	"testing"
)

// TestBatchCommands drives bcd batch approvals, bcd bulk and bcd batch list/show against a
// server: flags are checked, refused nodes are printed with their reasons.
func TestBatchCommands(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw"}
	if code, _, errs := run(t, env, "batch", "approvals", "set", "2", "--pool", "default", "--site", "default"); code == 0 || !strings.Contains(errs, "exactly one of") {
		t.Fatalf("two scopes: %d %q", code, errs)
	}
	if code, out, errs := run(t, env, "batch", "approvals", "set", "2", "--pool", "default"); code != 0 || !strings.Contains(out, "pool:") {
		t.Fatalf("set: %d %q %q", code, out, errs)
	}
	if code, out, _ := run(t, env, "batch", "approvals", "list"); code != 0 || !strings.Contains(out, "2") {
		t.Fatalf("list policies: %d %q", code, out)
	}
	if code, _, errs := run(t, env, "node", "enroll", "n1", "--bmc-address", "https://10.0.0.2", "--bmc-username", "root", "--mac", "52:54:00:00:00:ab"); code != 0 {
		t.Fatalf("enroll: %q", errs)
	}
	code, out, errs := run(t, env, "bulk", "retire", "--pool", "default", "--nodes", "n1,ghost", "--reason", "test")
	if code != 0 || !strings.Contains(out, "0 of 2 nodes accepted") || !strings.Contains(out, "ghost") || !strings.Contains(out, "retire applies only in") {
		t.Fatalf("bulk: %d %q %q", code, out, errs)
	}
	if code, _, errs := run(t, env, "bulk", "deploy", "--pool", "default", "--nodes", "n1", "--reason", "x"); code == 0 || !strings.Contains(errs, "image: is required") {
		t.Fatalf("bulk deploy: %d %q", code, errs)
	}
	// The server takes none when the pool has fewer than --count nodes that can deploy.
	if code, _, errs := run(t, env, "bulk", "deploy", "--pool", "default", "--count", "1", "--image", "img", "--reason", "x"); code == 0 || !strings.Contains(errs, "no catalog image") && !strings.Contains(errs, "nodes that can deploy now") {
		t.Fatalf("bulk deploy --count: %d %q", code, errs)
	}
	// --spread reaches the server, which checks its label key.
	if code, _, errs := run(t, env, "bulk", "deploy", "--pool", "default", "--count", "1", "--spread", "Rack!", "--image", "img", "--reason", "x"); code == 0 || !strings.Contains(errs, `spread: label key "Rack!" is not valid`) {
		t.Fatalf("bulk deploy --spread: %d %q", code, errs)
	}
	// --require is checked before anything is sent; the server's answer names what it left out.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--count", "1", "--require", "ram>=1GiB"}, `unknown key "ram"`},
		{[]string{"--nodes", "n1", "--require", "gpus>=1"}, "not with --nodes"},
		{[]string{"--count", "1", "--require", "memory>=1GiB"}, "no catalog image"},
	} {
		args := append([]string{"bulk", "deploy", "--pool", "default", "--image", "img", "--reason", "x"}, c.args...)
		if code, _, errs := run(t, env, args...); code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: %d %q, want %q", c.args, code, errs, c.want)
		}
	}
	if code, _, errs := run(t, env, "node", "inventory", "n1"); code == 0 || !strings.Contains(errs, "not_found") || !strings.Contains(errs, "no inventory yet") {
		t.Errorf("the inventory of a node never inspected: %d %q", code, errs)
	}
	if code, out, errs := run(t, env, "node", "list", "--hardware"); code != 0 || !strings.Contains(out, "THREADS  MEMORY  DISKS  GPUS") || !regexp.MustCompile(`n1 .* -\s+-\s+-\s+-\s+\S+\n`).MatchString(out) {
		t.Errorf("node list --hardware of a node never inspected: %d %q %q", code, out, errs)
	}
	if code, out, errs := run(t, env, "batch", "list"); code != 0 || !strings.Contains(out, "STATE") {
		t.Fatalf("batch list: %d %q %q", code, out, errs)
	}
	if code, _, errs := run(t, env, "batch", "show", "nope"); code == 0 || !strings.Contains(errs, "not_found") {
		t.Fatalf("show unknown: %d %q", code, errs)
	}
	if code, out, _ := run(t, env, "doctor"); code != 0 || !strings.Contains(out, "batches waiting for approval") || !strings.Contains(out, "servers: 1") {
		t.Fatalf("doctor: %d %q", code, out)
	}
}

// A spread bulk deploy's answer is summed up by value, in order, the nodes without the label
// last.
func TestSpreadLine(t *testing.T) {
	for _, tc := range []struct {
		taken map[string]int32
		want  string
	}{
		{map[string]int32{"r2": 57, "(none)": 56, "r1": 57, "r3": 30}, "spread over rack: r1 57, r2 57, r3 30, (none) 56"},
		{map[string]int32{"(none)": 3}, "spread over rack: (none) 3"},
		{map[string]int32{"b": 1, "a": 2}, "spread over rack: a 2, b 1"},
	} {
		if got := spreadLine("rack", tc.taken); got != tc.want {
			t.Errorf("spreadLine(%v) = %q, want %q", tc.taken, got, tc.want)
		}
	}
}
