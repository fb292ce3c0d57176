package cli

import (
	"regexp"
	"strings"
	"testing"

	"bcd/internal/gen/bcdv1"
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

// bcd bulk --wait and bcd batch wait follow a batch to its end: a retirement held for approval,
// then rejected, ends with its node aborted (listed, exit 7); the progress goes to stderr.
func TestBatchWait(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw"}
	for _, args := range [][]string{
		{"node", "enroll", "w1", "--bmc-address", "https://10.0.0.7", "--bmc-username", "root"},
		{"node", "abort", "w1", "--reason", "to retire it"}, // failed: retire takes it, out of maintenance
		{"node", "maintenance", "w1", "off"},
		{"batch", "approvals", "set", "1", "--pool", "default"},
	} {
		if code, out, errs := run(t, env, args...); code != 0 {
			t.Fatalf("%v: %d %q %q", args, code, out, errs)
		}
	}
	if code, _, errs := run(t, env, "bulk", "retire", "--pool", "default", "--nodes", "w1", "--reason", "x", "--wait", "-o", "json"); code != exitUsage || !strings.Contains(errs, "bcd batch wait ID -o json") {
		t.Fatalf("--wait with -o json: %d %q", code, errs)
	}
	// Held: --wait follows it while it waits for an approval; it stops waiting at the timeout.
	code, out, errs := run(t, env, "bulk", "retire", "--pool", "default", "--nodes", "w1", "--reason", "end of life", "--wait", "--wait-timeout", "3s")
	id := regexp.MustCompile(`batch (\S+): held until 1 approvals`).FindStringSubmatch(out)
	if code != exitUnavailable || id == nil || !strings.Contains(errs, "waiting for approvals 0/1") || !strings.Contains(errs, "stopped waiting after 3s") {
		t.Fatalf("bulk --wait of a held batch: %d %q %q", code, out, errs)
	}
	code, out, errs = run(t, env, "token", "create", "rejecter", "--role", "approver")
	secret := regexp.MustCompile(`(?m)^bcd\w*_\S+$`).FindString(out)
	if code != 0 || secret == "" {
		t.Fatalf("approver token: %d %q %q", code, out, errs)
	}
	if code, out, errs := run(t, map[string]string{"BCD_SERVER": url, "BCD_TOKEN": secret}, "batch", "reject", id[1], "--reason", "not this week"); code != 0 {
		t.Fatalf("reject: %d %q %q", code, out, errs)
	}
	code, out, errs = run(t, env, "batch", "wait", id[1], "--timeout", "30s")
	if code != exitNodeFailed || !strings.Contains(out, "0 failed, 1 aborted") || !regexp.MustCompile(`w1\s+aborted\s+BATCH_REJECTED`).MatchString(out) ||
		!strings.Contains(errs, "1 were aborted") {
		t.Fatalf("batch wait of a rejected batch: %d %q %q", code, out, errs)
	}
	if code, out, _ := run(t, env, "batch", "show", id[1]); code != 0 || !strings.Contains(out, "nodes at rest 1/1: 0 failed, 1 aborted") || !strings.Contains(out, "BATCH_REJECTED") {
		t.Fatalf("batch show of a rejected batch: %d %q", code, out)
	}
	if code, out, _ := run(t, env, "batch", "list"); code != 0 || !regexp.MustCompile(`(?m)^ID\s+STATE\s+KIND\s+VERB\s+SIZE\s+AT REST\s+APPROVALS`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(id[1])+`\s+rejected\s+bulk\s+retire\s+1\s+1/1\s+0/1\s`).MatchString(out) {
		t.Fatalf("batch list: %d %q", code, out)
	}
}

// A batch's status line says where it is; a log gets a line per tenth of its nodes at rest.
func TestBatchStatus(t *testing.T) {
	m := &bcdv1.GetBatchResponse{Batch: &bcdv1.Batch{Id: "b1", Verb: "deploy", State: "running", Size: 1000, Parked: 188}, Failed: 3, Aborted: 1}
	if got, want := batchStatus(m), "batch b1 deploy running: 812/1000 at rest, 3 failed, 1 aborted"; got != want {
		t.Errorf("batchStatus = %q, want %q", got, want)
	}
	key := batchStatusKey(m)
	m.Batch.Parked = 150 // 850 at rest: the same tenth
	if batchStatusKey(m) != key {
		t.Errorf("a log line for each node at rest: %q then %q", key, batchStatusKey(m))
	}
	m.Batch.Parked = 99 // 901: the next tenth
	if batchStatusKey(m) == key {
		t.Errorf("no log line at the next tenth: %q", key)
	}
	held := &bcdv1.GetBatchResponse{Batch: &bcdv1.Batch{Id: "b2", Verb: "retire", State: "pending", Size: 2, Parked: 2, Required: 2, Approvers: []string{"alice"}}}
	if got, want := batchStatus(held), "batch b2 retire pending: 0/2 at rest · waiting for approvals 1/2 (bcd batch approve b2)"; got != want {
		t.Errorf("batchStatus = %q, want %q", got, want)
	}
	if batchDone(held.Batch) || !batchDone(&bcdv1.Batch{Size: 2}) {
		t.Errorf("batchDone: a held batch done, or one parked on none not")
	}
}
