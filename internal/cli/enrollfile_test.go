package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/pflag"

	"bcd/internal/gen/bcdv1"
)

// enrollCSV is a CSV file of n good rows named prefix-0…: row i has id base+i, which makes its
// loopback BMC address https://127.A.B.C:623 and its MAC 52:54:ID (4 bytes), and the password
// "pw-secret-<prefix>-<i>".
func enrollCSV(prefix string, base, n int) string {
	var b strings.Builder
	b.WriteString("name,bmc-address,bmc-username,bmc-password,mac,label\n")
	for i := range n {
		id := base + i
		fmt.Fprintf(&b, "%s-%d,https://127.%d.%d.%d:623,root,pw-secret-%s-%d,52:54:%02x:%02x:%02x:%02x,rack=r%d;row=a\n",
			prefix, i, id>>16&0xff, id>>8&0xff, id&0xff, prefix, i, id>>24&0xff, id>>16&0xff, id>>8&0xff, id&0xff, i%4)
	}
	return b.String()
}

func writeEnrollFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nodes.csv")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type listedNode struct {
	ID, Name, Pool string
	Macs           []string
	Labels         map[string]string
	BootMode       string
	Bmc            struct{ Driver, Address string }
}

// listNodes is every node, by name, through the API.
func listNodes(t *testing.T, env map[string]string) map[string]listedNode {
	t.Helper()
	code, out, errs := run(t, env, "node", "list", "-o", "json", "--all", "--page-size", "10000")
	var list struct{ Nodes []listedNode }
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("node list: %d %s %s", code, out, errs)
	}
	m := map[string]listedNode{}
	for _, n := range list.Nodes {
		m[n.Name] = n
	}
	return m
}

func noSecret(t *testing.T, what, text string) {
	t.Helper()
	if strings.Contains(text, "pw-secret") || strings.Contains(text, "env-secret") || strings.Contains(text, "file-secret") {
		t.Errorf("%s shows a password:\n%s", what, text)
	}
}

// TestEnrollFileColumnsMatchFlags: the columns are the enroll flags' names (plus name and
// bmc-password), so that a new flag is a column or is said not to be one.
func TestEnrollFileColumnsMatchFlags(t *testing.T) {
	cmd := enrollCmd(&globals{env: Env{Getenv: func(string) string { return "" }}})
	var flags []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(enrollOnlyFlags(), f.Name) {
			flags = append(flags, f.Name)
		}
	})
	cols := slices.DeleteFunc(enrollColumnNames(), func(c string) bool { return c == "name" || c == "bmc-password" })
	slices.Sort(flags)
	slices.Sort(cols)
	if !slices.Equal(flags, cols) {
		t.Fatalf("columns %v, flags %v", cols, flags)
	}
}

// TestEnrollFileGood: 50 rows, all enrolled as the file says; the summary is one line (not a
// terminal: no progress bar) and no password is shown.
func TestEnrollFileGood(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	path := writeEnrollFile(t, enrollCSV("g", 20000, 50))
	code, out, errs := run(t, env, "node", "enroll", "--from", path)
	if code != 0 || errs != "" || out != path+": 50 rows: 50 enrolled, 0 existed, 0 failed\n" {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
	noSecret(t, "output", out+errs)
	nodes := listNodes(t, env)
	if len(nodes) != 50 {
		t.Fatalf("%d nodes enrolled, want 50", len(nodes))
	}
	n := nodes["g-7"]
	if n.Bmc.Address != "https://127.0.78.39:623" || !slices.Equal(n.Macs, []string{"52:54:00:00:4e:27"}) || n.Labels["rack"] != "r3" || n.Labels["row"] != "a" || n.Pool != "default" {
		t.Fatalf("g-7 as enrolled: %+v", n)
	}
}

// TestEnrollFileJSONLines: a file whose first character is '{' is JSON Lines.
func TestEnrollFileJSONLines(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	path := writeEnrollFile(t, `{"name":"j1","bmc-address":"127.0.0.1:20623","bmc-driver":"ipmi","bmc-username":"root","bmc-password":"pw-secret-j1","mac":["52:54:00:00:01:01","52:54:00:00:01:02"],"label":"rack=r1","insecure-tls":true}

{"name":"j2","bmc-address":"https://127.0.0.1:20624","bmc-username":"root","bmc-password":"pw-secret-j2","boot-mode":"uefi"}
`)
	code, out, errs := run(t, env, "node", "enroll", "--from", path)
	if code != 0 || !strings.Contains(out, "2 enrolled") {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
	nodes := listNodes(t, env)
	if j1 := nodes["j1"]; j1.Bmc.Driver != "ipmi" || len(j1.Macs) != 2 || j1.Labels["rack"] != "r1" {
		t.Fatalf("j1: %+v", j1)
	}
	if j2 := nodes["j2"]; j2.BootMode != "uefi" {
		t.Fatalf("j2: %+v", j2)
	}
}

// TestEnrollFileBadRows: every class of bad row is refused with its line and column, nothing
// is enrolled (not even the good rows), the exit code is 2 and no password is shown.
func TestEnrollFileBadRows(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	const header = "name,bmc-address,bmc-username,bmc-password,mac,bmc-driver,label,insecure-tls,tls-fingerprint,product-uuid,boot-mode\n"
	good := "ok-1,https://127.0.0.1:21001,root,pw-secret-1,52:54:00:00:00:01,,,,,,\n" +
		"ok-2,https://127.0.0.1:21002,root,pw-secret-2,52:54:00:00:00:02,,,,,,\n"
	for _, tc := range []struct {
		name, header, row string
		want              []string // in stderr
	}{
		{"unknown column", "name,bmc-adress\n", "", []string{`line 1: unknown column "bmc-adress": accepted are name, pool, bmc-driver, bmc-address`}},
		{"column twice", "name,pool,pool\n", "", []string{"line 1: column pool is named twice"}},
		{"no name column", "bmc-address\n", "", []string{"line 1: the header has no name column"}},
		{"fields", "", "x-1,https://127.0.0.1:21003,root,pw-secret,with,comma,,,,,,,\n", []string{"line 4", "has 13 fields, the header has 11"}},
		{"name", "", "Bad_Name,https://127.0.0.1:21003,root,pw-secret-3,,,,,,,\n", []string{`line 4, column name: "Bad_Name" is not a valid name`}},
		{"name like an id", "", "0b7c7f2e-9a5e-4c1e-8f1e-3c1b2a4d5e6f,https://127.0.0.1:21003,root,pw-secret-3,,,,,,,\n", []string{"line 4 (0b7c7f2e-9a5e-4c1e-8f1e-3c1b2a4d5e6f), column name:", "shaped like an id"}},
		{"no name", "", ",https://127.0.0.1:21003,root,pw-secret-3,,,,,,,\n", []string{"line 4, column name: is required"}},
		{"mac", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,52:54:00:zz:00:03,,,,,,\n", []string{`line 4 (x-3), column mac: "52:54:00:zz:00:03" is not an Ethernet MAC`}},
		{"multicast mac", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,01:00:5e:00:00:03,,,,,,\n", []string{"line 4 (x-3), column mac: 01:00:5e:00:00:03 is a multicast address"}},
		{"mac twice in a row", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,52:54:00:00:00:03;52-54-00-00-00-03,,,,,,\n", []string{"column mac: 52:54:00:00:00:03 is listed twice"}},
		{"redfish address", "", "x-3,127.0.0.1:21003,root,pw-secret-3,,redfish,,,,,\n", []string{"line 4 (x-3), column bmc-address:", "is not a Redfish service address"}},
		{"ipmi address", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,ipmi,,,,,\n", []string{"column bmc-address:", "an IPMI address is HOST[:PORT] without a scheme"}},
		{"address with password", "", "x-3,https://root:pw-secret-3@127.0.0.1:21003,root,pw-secret-3,,,,,,,\n", []string{"column bmc-address: a BMC address must not carry credentials"}},
		{"no address", "", "x-3,,root,pw-secret-3,,,,,,,\n", []string{"column bmc-address: is required"}},
		{"driver", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,pw-secret-in-driver,,,,,\n", []string{"column bmc-driver: unknown driver: accepted are redfish, ipmi"}},
		{"no username", "", "x-3,https://127.0.0.1:21003,,pw-secret-3,,,,,,,\n", []string{"column bmc-username: is required"}},
		{"no password", "", "x-3,https://127.0.0.1:21003,root,,,,,,,,\n", []string{"column bmc-password: is empty and no default is given: --bmc-password-file FILE or env BCD_BMC_PASSWORD"}},
		{"password with a control character", "", "x-3,https://127.0.0.1:21003,root,\"pw-secret\x01-3\",,,,,,,\n", []string{"column bmc-password: contains a control character"}},
		{"label", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,,rack,,,,\n", []string{`column label: "rack": use key=value, several separated by ';'`}},
		{"label key", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,,Rack=1,,,,\n", []string{`column label: label key "Rack" is not valid`}},
		{"insecure-tls", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,,,maybe,,,\n", []string{`column insecure-tls: "maybe": accepted are true, false`}},
		{"fingerprint", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,,,,pw-secret-3,,\n", []string{"column tls-fingerprint: is not a SHA-256 fingerprint"}},
		{"uuid", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,,,,,not-a-uuid,\n", []string{`column product-uuid: "not-a-uuid" is not a UUID`}},
		{"boot mode", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,,,,,,,bios\n", []string{`column boot-mode: "bios": accepted are uefi, legacy`}},
		{"name on two rows", "", "ok-1,https://127.0.0.1:21003,root,pw-secret-3,,,,,,,\n", []string{"line 4 (ok-1), column name: name ok-1 is on line 2 too"}},
		{"MAC on two rows", "", "x-3,https://127.0.0.1:21003,root,pw-secret-3,52:54:00:00:00:09;52:54:00:00:00:02,,,,,,\n", []string{"line 4 (x-3), column mac: MAC 52:54:00:00:00:02 is on line 3 too"}},
		{"BMC address on two rows", "", "x-3,HTTPS://127.0.0.1:21001,root,pw-secret-3,,,,,,,\n", []string{"line 4 (x-3), column bmc-address: BMC address https://127.0.0.1:21001 is on line 2 too"}},
		{"quote out of place", "", "x-3,https://127.0.0.1:21003,root,pw\"secret-3,,,,,,,\n", []string{"line 4: not CSV at column", "nothing after it was read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := cmp.Or(tc.header, header)
			content := h
			if tc.header == "" {
				content += good + tc.row
			}
			path := writeEnrollFile(t, content)
			code, out, errs := run(t, env, "node", "enroll", "--from", path)
			if code != exitUsage || out != "" || !strings.Contains(errs, "nothing was enrolled") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errs)
				}
			}
			noSecret(t, "stderr", errs)
			if n := listNodes(t, env); len(n) != 0 {
				t.Fatalf("%d nodes enrolled from a refused file", len(n))
			}
		})
	}
}

// TestEnrollFileJSONLinesBadRows: JSON Lines refusals quote no password either.
func TestEnrollFileJSONLinesBadRows(t *testing.T) {
	for _, tc := range []struct{ name, line, want string }{
		{"not JSON", `{"name":"j1","bmc-password":"pw-secret"x}`, "line 2: not JSON at byte"},
		{"unknown key", `{"name":"j1","bmc-pasword":"pw-secret"}`, `line 2 (j1): unknown key "bmc-pasword": accepted are name`},
		{"number", `{"name":"j1","bmc-password":12345}`, "line 2 (j1), column bmc-password: use a string"},
		{"list for one value", `{"name":"j1","pool":["a","b"]}`, "line 2 (j1), column pool: use a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, probs := readEnrollFile([]byte(`{"name":"j0","bmc-address":"https://127.0.0.1:1","bmc-username":"u","bmc-password":"pw-secret"}` + "\n" + tc.line + "\n"))
			if len(rows) != 1 || len(probs) != 1 || !strings.Contains(probs[0].String(), tc.want) {
				t.Fatalf("rows %d, problems %v; want %q", len(rows), probs, tc.want)
			}
			noSecret(t, "problem", probs[0].String())
		})
	}
}

// TestEnrollFileDefaults: the flags fill the cells a row leaves empty; --label is merged under
// the row's labels; a BOM and spreadsheet-style headers are read.
func TestEnrollFileDefaults(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "env-secret"}
	for _, args := range [][]string{{"site", "create", "nyc"}, {"pool", "create", "gpu", "--site", "nyc"}} {
		if code, out, errs := run(t, env, args...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errs)
		}
	}
	path := writeEnrollFile(t, "\uFEFFName,BMC Address,bmc_username,BMC-Password,Pool,Label,Boot Mode,bmc-driver\n"+
		"d-1,127.0.0.1:22001,,,,,,\n"+
		"d-2,https://127.0.0.1:22002,admin,pw-secret-2,default,rack=own;team=x,legacy,redfish\n"+
		",,,,,,,\n")
	code, out, errs := run(t, env, "node", "enroll", "--from", path, "--pool", "gpu", "--bmc-driver", "ipmi", "--bmc-username", "op",
		"--label", "team=dc", "--label", "rack=r1", "--boot-mode", "uefi")
	if code != 0 || !strings.Contains(out, "2 rows: 2 enrolled") {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
	noSecret(t, "output", out+errs)
	nodes := listNodes(t, env)
	d1, d2 := nodes["d-1"], nodes["d-2"]
	if d1.Pool != "gpu" || d1.Bmc.Driver != "ipmi" || d1.BootMode != "uefi" || d1.Labels["team"] != "dc" || d1.Labels["rack"] != "r1" {
		t.Errorf("d-1 (defaults): %+v", d1)
	}
	if d2.Pool != "default" || d2.Bmc.Driver != "redfish" || d2.BootMode != "legacy" || d2.Labels["team"] != "x" || d2.Labels["rack"] != "own" {
		t.Errorf("d-2 (its own values): %+v", d2)
	}
	// Flags that name one machine are refused with --from, as is NAME.
	for _, args := range [][]string{
		{"node", "enroll", "--from", path, "--mac", "52:54:00:00:00:01"},
		{"node", "enroll", "--from", path, "--bmc-address", "https://127.0.0.1:1"},
		{"node", "enroll", "--from", path, "n1"},
		{"node", "enroll", "--from", path, "--parallel", "0"},
	} {
		if code, _, errs := run(t, env, args...); code != exitUsage {
			t.Errorf("%v: exit %d %q", args, code, errs)
		}
	}
}

// TestEnrollFileRerun: after a run in which some rows failed, the same file run again reports
// the rows enrolled before as exists and enrolls the rest; a name that exists with another BMC
// address is a failed row.
func TestEnrollFileRerun(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	// Rows 5-9 name a pool that does not exist yet: the server refuses them (not_found).
	content := enrollCSV("r", 23000, 10)
	lines := strings.Split(content, "\n")
	lines[0] += ",pool"
	for i := 1; i <= 10; i++ {
		pool := "default"
		if i > 5 {
			pool = "later"
		}
		lines[i] += "," + pool
	}
	path := writeEnrollFile(t, strings.Join(lines, "\n"))
	code, out, errs := run(t, env, "node", "enroll", "--from", path, "--parallel", "3")
	if code != exitNotFound || !strings.Contains(out, "10 rows: 5 enrolled, 0 existed, 5 failed") ||
		!strings.Contains(out, `r-7   not_found: pool "later"`) || !strings.Contains(errs, "5 of 10 rows failed") {
		t.Fatalf("first run: %d %q %q", code, out, errs)
	}
	noSecret(t, "output", out+errs)
	if code, out, errs := run(t, env, "site", "create", "s2"); code != 0 {
		t.Fatal(out, errs)
	}
	if code, out, errs := run(t, env, "pool", "create", "later", "--site", "s2"); code != 0 {
		t.Fatal(out, errs)
	}
	code, out, errs = run(t, env, "node", "enroll", "--from", path, "-o", "json")
	if code != 0 || strings.Count(out, `"status":"exists"`) != 5 || strings.Count(out, `"status":"enrolled"`) != 5 {
		t.Fatalf("second run: %d %q %q", code, out, errs)
	}
	if n := listNodes(t, env); len(n) != 10 {
		t.Fatalf("%d nodes, want 10", len(n))
	}
	// The same name with another BMC address: another machine.
	other := writeEnrollFile(t, "name,bmc-address,bmc-username,bmc-password\nr-0,https://127.0.0.1:29999,root,pw-secret-x\nr-new,https://127.0.0.1:29998,root,pw-secret-y\n")
	code, out, errs = run(t, env, "node", "enroll", "--from", other)
	if code != exitRefused || !strings.Contains(out, "1 enrolled, 0 existed, 1 failed") ||
		!strings.Contains(out, "a node named r-0 exists already with BMC redfish https://127.0.89.216:623, not the row's https://127.0.0.1:29999") {
		t.Fatalf("other machine: %d %q %q", code, out, errs)
	}
	noSecret(t, "output", out+errs)
}

// TestEnrollFileServerRefusal: a row the server refuses does not stop the others; the summary
// names it with the server's reason and the exit code says what refused it.
func TestEnrollFileServerRefusal(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "env-secret"}
	// A node outside the file holds a MAC of row 3.
	if code, out, errs := run(t, env, "node", "enroll", "holder", "--bmc-address", "https://127.0.0.1:24999", "--bmc-username", "root", "--mac", "52:54:00:00:24:03"); code != 0 {
		t.Fatal(out, errs)
	}
	content := "name,bmc-address,bmc-username,bmc-password,mac\n"
	for i := range 8 {
		content += fmt.Sprintf("s-%d,https://127.0.0.1:%d,root,pw-secret-%d,52:54:00:00:24:%02d\n", i, 24000+i, i, i+1)
	}
	path := writeEnrollFile(t, content)
	code, out, errs := run(t, env, "node", "enroll", "--from", path)
	if code != exitRefused || !strings.Contains(out, "8 rows: 7 enrolled, 0 existed, 1 failed") ||
		!strings.Contains(out, "4     s-2   already_exists: enrolling s-2: MAC 52:54:00:00:24:03 already belongs to another node") ||
		!strings.Contains(errs, "error: already_exists: 1 of 8 rows failed") {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
	noSecret(t, "output", out+errs)
	if n := listNodes(t, env); len(n) != 8 {
		t.Fatalf("%d nodes, want 8 (holder and 7 rows)", len(n))
	}
}

// TestEnrollFileJSONOutput: -o json is one object per row, in file order, every field present;
// the summary goes to stderr.
func TestEnrollFileJSONOutput(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	content := enrollCSV("o", 25000, 12)
	lines := strings.Split(content, "\n")
	lines[0] += ",pool"
	for i := 1; i <= 12; i++ {
		lines[i] += ",default"
	}
	lines[6] = strings.TrimSuffix(lines[6], ",default") + ",nosuch" // row o-5, line 7
	path := writeEnrollFile(t, strings.Join(lines, "\n"))
	code, out, errs := run(t, env, "node", "enroll", "--from", path, "-o", "json", "--parallel", "4")
	if code != exitNotFound || !strings.Contains(errs, "12 rows: 11 enrolled, 0 existed, 1 failed") {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
	noSecret(t, "output", out+errs)
	objs := strings.Split(strings.TrimSpace(out), "\n")
	if len(objs) != 12 {
		t.Fatalf("%d objects, want 12:\n%s", len(objs), out)
	}
	for i, o := range objs {
		var m map[string]any
		if err := json.Unmarshal([]byte(o), &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		keys := slices.Sorted(func(y func(string) bool) {
			for k := range m {
				if !y(k) {
					return
				}
			}
		})
		if !slices.Equal(keys, []string{"code", "error", "line", "name", "nodeId", "status"}) {
			t.Fatalf("keys %v", keys)
		}
		if m["line"] != float64(i+2) || m["name"] != fmt.Sprintf("o-%d", i) {
			t.Fatalf("object %d out of file order: %s", i, o)
		}
		if i == 5 {
			if m["status"] != "failed" || m["code"] != "not_found" || !strings.Contains(m["error"].(string), `pool "nosuch"`) || m["nodeId"] != "" {
				t.Fatalf("failed row: %s", o)
			}
		} else if m["status"] != "enrolled" || m["nodeId"] == "" || m["error"] != "" {
			t.Fatalf("row %d: %s", i, o)
		}
	}
}

// TestEnrollFileStopsOnDenied: a failure every row would have (a bad token) stops sending.
func TestEnrollFileStopsOnDenied(t *testing.T) {
	url, _ := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": "bcd_wrong"}
	path := writeEnrollFile(t, enrollCSV("u", 26000, 20))
	code, out, errs := run(t, env, "node", "enroll", "--from", path, "--parallel", "1")
	if code != exitDenied || !strings.Contains(out, "20 rows: 0 enrolled, 0 existed, 1 failed, 19 not sent") || !strings.Contains(errs, "stopped after a failure every row would have") {
		t.Fatalf("enroll: %d %q %q", code, out, errs)
	}
}

// fakeEnroll is a node service whose Enroll waits for release (once cancel is set, until the
// test releases it).
type fakeEnroll struct {
	mu       sync.Mutex
	calls    []string
	started  chan string
	release  chan struct{}
	ctxErrs  []error
	failWith func(name string) error
}

func (f *fakeEnroll) Enroll(ctx context.Context, req *connect.Request[bcdv1.EnrollRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	f.mu.Lock()
	f.calls = append(f.calls, req.Msg.Name)
	f.mu.Unlock()
	if f.started != nil {
		f.started <- req.Msg.Name
		<-f.release
	}
	f.mu.Lock()
	f.ctxErrs = append(f.ctxErrs, ctx.Err())
	f.mu.Unlock()
	if f.failWith != nil {
		if err := f.failWith(req.Msg.Name); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&bcdv1.NodeResponse{Node: &bcdv1.Node{Id: "id-" + req.Msg.Name, Name: req.Msg.Name}}), nil
}

func (f *fakeEnroll) Get(context.Context, *connect.Request[bcdv1.GetNodeRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	return nil, connect.NewError(connect.CodeNotFound, errors.New("no such node"))
}

func fakeJobs(n int) []enrollJob {
	var jobs []enrollJob
	for i := range n {
		jobs = append(jobs, enrollJob{line: i + 2, req: &bcdv1.EnrollRequest{Name: fmt.Sprintf("f-%d", i), Bmc: &bcdv1.BmcCredentials{Password: "pw-secret"}}})
	}
	return jobs
}

// TestEnrollRunInterrupt: once interrupted no row is sent; the calls in flight finish with a
// context that is not cancelled, and the others are not_sent.
func TestEnrollRunInterrupt(t *testing.T) {
	f := &fakeEnroll{started: make(chan string), release: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan []enrollResult, 1)
	go func() {
		done <- enrollRun{nodes: f, parallel: 2, grace: time.Minute, redact: func(s string) string { return s }}.run(ctx, fakeJobs(10))
	}()
	<-f.started
	<-f.started // two in flight
	cancel()
	close(f.release)
	res := <-done
	var statuses []string
	for _, r := range res {
		statuses = append(statuses, r.Status)
	}
	if !slices.Equal(statuses[:2], []string{rowEnrolled, rowEnrolled}) || slices.ContainsFunc(statuses[2:], func(s string) bool { return s != rowNotSent }) {
		t.Fatalf("statuses %v", statuses)
	}
	if len(f.calls) != 2 || f.ctxErrs[0] != nil || f.ctxErrs[1] != nil {
		t.Fatalf("calls %v, their contexts %v", f.calls, f.ctxErrs)
	}
}

// TestEnrollRunRedactsServerMessages: a server message that quotes a password is shown
// without it.
func TestEnrollRunRedactsServerMessages(t *testing.T) {
	f := &fakeEnroll{failWith: func(name string) error {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("bmc.password: pw-secret is not accepted"))
	}}
	res := enrollRun{nodes: f, parallel: 3, redact: redactor([]string{"pw", "pw-secret"})}.run(context.Background(), fakeJobs(5))
	for _, r := range res {
		if r.Status != rowFailed || r.Code != "invalid_argument" || r.Error != "bmc.password: [redacted] is not accepted" {
			t.Fatalf("%+v", r)
		}
	}
}

// TestEnrollProgress: on a terminal the bar counts the rows by outcome.
func TestEnrollProgress(t *testing.T) {
	var b bytes.Buffer
	p := &enrollProgress{w: &b, total: 3, start: time.Now()}
	p.add(rowEnrolled)
	p.add(rowExists)
	p.add(rowFailed)
	p.finish()
	if !strings.Contains(b.String(), "\r[==============================] 3/3  1 enrolled, 1 existed, 1 failed") || !strings.HasSuffix(b.String(), "\n") {
		t.Fatalf("%q", b.String())
	}
	if isTerminal(&b) {
		t.Fatal("a buffer is no terminal")
	}
}

// BenchmarkEnrollFile measures rows enrolled per second from a 1,000-row file against an
// in-process SQLite server, one row at a time and eight at once.
func BenchmarkEnrollFile(b *testing.B) {
	for _, parallel := range []int{1, 8} {
		b.Run(fmt.Sprintf("parallel=%d", parallel), func(b *testing.B) {
			srv := newServer(b)
			env := map[string]string{"BCD_SERVER": srv.URL(), "BCD_TOKEN": srv.FirstAdminToken()}
			var elapsed time.Duration
			rows := 0
			for i := 0; b.Loop(); i++ {
				p := filepath.Join(b.TempDir(), "nodes.csv")
				os.WriteFile(p, []byte(enrollCSV(fmt.Sprintf("b%d", i), 30000+i*1000, 1000)), 0o600)
				start := time.Now()
				var out, errb bytes.Buffer
				code := Run(context.Background(), Env{Args: []string{"node", "enroll", "--from", p, "--parallel", fmt.Sprint(parallel)},
					Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb})
				elapsed += time.Since(start)
				if code != 0 {
					b.Fatalf("%d %s %s", code, out.String(), errb.String())
				}
				rows += 1000
			}
			b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
		})
	}
}

// TestEnrollOutputFileOrder: with -o json a row is printed once every row before it is, so the
// objects come in file order whatever order the rows complete in.
func TestEnrollOutputFileOrder(t *testing.T) {
	var out bytes.Buffer
	o := &enrollOutput{g: &globals{output: "json", env: Env{Stdout: &out}}, total: 3, results: make([]*enrollResult, 3)}
	o.done(2, enrollResult{Line: 4, Name: "c", Status: rowEnrolled})
	if out.Len() != 0 {
		t.Fatalf("row 3 printed before rows 1 and 2: %s", out.String())
	}
	o.done(0, enrollResult{Line: 2, Name: "a", Status: rowEnrolled})
	o.done(1, enrollResult{Line: 3, Name: "b", Status: rowExists})
	want := `{"line":2,"name":"a","status":"enrolled","nodeId":"","code":"","error":""}
{"line":3,"name":"b","status":"exists","nodeId":"","code":"","error":""}
{"line":4,"name":"c","status":"enrolled","nodeId":"","code":"","error":""}
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestEnrollKeepsConnections: the API client keeps as many idle connections as --parallel may
// use (Go's default of 2 made six of eight calls dial anew: 445 connections for 1,000 rows).
func TestEnrollKeepsConnections(t *testing.T) {
	g := &globals{env: Env{Getenv: func(string) string { return "" }}, server: "http://127.0.0.1:1", output: "table"}
	if _, err := g.clients(); err != nil {
		t.Fatal(err)
	}
	sc, ok := g.hc.Transport.(schemeCheck)
	if !ok {
		t.Fatalf("the API client's transport is a %T", g.hc.Transport)
	}
	if tr, ok := sc.next.(*http.Transport); !ok || tr.MaxIdleConnsPerHost < maxParallel {
		t.Fatalf("idle connections per host: %+v", sc.next)
	}
}
