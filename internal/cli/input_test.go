package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"bcd/internal/catalog"
)

// TestArgumentErrorsNameTheArguments: every command of this package that takes positional
// arguments says, given too few or too many, which ones it takes ("bcd node get takes NODE; 0
// given"), not cobra's "accepts 1 arg(s), received 0".
func TestArgumentErrorsNameTheArguments(t *testing.T) {
	root := newRoot(Env{Getenv: func(string) string { return "" }, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	// Commands of other packages, with their own argument checks.
	other := map[string]bool{"bcd lab": true, "bcd ramdisk": true, "bcd bmc": true, "bcd site run": true}
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if other[c.CommandPath()] {
			return
		}
		if c.Runnable() && c.Args != nil {
			for _, args := range [][]string{nil, {"a", "b", "c", "d", "e"}} {
				err := c.Args(c, args)
				if err == nil {
					continue
				}
				checked++
				if msg := err.Error(); strings.Contains(msg, "arg(s)") || !strings.HasPrefix(msg, c.CommandPath()+" takes ") && !strings.HasPrefix(msg, "unknown command") {
					t.Errorf("%s with %d arguments: %q does not say which arguments it takes", c.CommandPath(), len(args), msg)
				}
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if checked < 40 {
		t.Fatalf("only %d refusals checked: the walk missed the commands", checked)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "get"}, "bcd node get takes NODE; 0 given"},
		{[]string{"node", "deploy", "a", "b"}, "bcd node deploy takes NODE; 2 given"},
		{[]string{"node", "confirm-mac", "n1"}, "bcd node confirm-mac takes NODE and MAC; 1 given"},
		{[]string{"events", "a", "b"}, "bcd events takes at most one NODE (none: the events of every node); 2 given"},
		{[]string{"bulk"}, "bcd bulk takes the VERB: manage, inspect, provide, deploy, undeploy, rescue or retire; 0 given"},
		{[]string{"batch", "approvals", "set"}, "bcd batch approvals set takes N; 0 given"},
	} {
		code, _, errs := run(t, map[string]string{"BCD_SERVER": "http://127.0.0.1:1"}, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: %d %q, want %q", tc.args, code, errs, tc.want)
		}
	}
}

// TestBadValuesRefused: values a command cannot work with are refused before any call or
// work, saying which flag and what is accepted; none panics, none is sent wrapped.
func TestBadValuesRefused(t *testing.T) {
	env := map[string]string{"BCD_SERVER": "http://127.0.0.1:1"} // nothing listens: any call would fail otherwise
	for _, tc := range []struct {
		args []string
		want string
	}{
		// An int32 request field would carry 4294967296 as 0: the policy removed.
		{[]string{"batch", "approvals", "set", "4294967296", "--pool", "default"}, `N "4294967296": accepted are 0 to 10 approvals`},
		{[]string{"batch", "approvals", "set", "4294967297", "--installation"}, `N "4294967297": accepted are 0 to 10 approvals`},
		{[]string{"batch", "approvals", "set", "two", "--installation"}, `N "two": accepted are 0 to 10 approvals`},
		{[]string{"batch", "approvals", "set", "11", "--installation"}, `N "11": accepted are 0 to 10 approvals`},
		{[]string{"profile", "put", "p1"}, "--file PROFILE.json is required"},
		{[]string{"bench", "api", "--nodes", "-5"}, "--nodes -5: accepted is 1 or more"},
		{[]string{"bench", "api", "--nodes", "10", "--clients", "0"}, "--clients 0: accepted is 1 or more"},
		{[]string{"sim", "--nodes", "-1"}, "--nodes -1: accepted is 1 or more"},
		{[]string{"sim", "--nodes", "2", "--bmc-error-rate", "2"}, "--bmc-error-rate 2: accepted are fractions from 0 to 1"},
		{[]string{"sim", "--nodes", "2", "--wipe-readback-fail-rate", "-0.5"}, "--wipe-readback-fail-rate -0.5: accepted are fractions from 0 to 1"},
		{[]string{"sim", "--nodes", "2", "--ramdisk-death-rate", "1.5"}, "--ramdisk-death-rate 1.5: accepted are fractions from 0 to 1"},
		{[]string{"sim", "--nodes", "2", "--latency", "-1s"}, "--latency -1s: accepted is a duration of 0 or more"},
		{[]string{"sim", "--nodes", "2", "--timeout", "0s"}, "--timeout 0s: accepted is a duration above 0"},
		{[]string{"sim", "--nodes", "2", "--workers", "-3"}, "--workers -3: accepted is 0 (the engine's default) or more"},
		// A mistyped unit must not delete history within minutes.
		{[]string{"server", "--history-retention", "90m"}, "--history-retention 1h30m0s: use 24h0m0s or more, or 0 to keep it for ever"},
		{[]string{"server", "--event-retention", "-1h"}, "--event-retention -1h0m0s: use 24h0m0s or more, or 0 to keep it for ever"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := run(t, env, tc.args...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Errorf("%d %q %q, want %q", code, out, errs, tc.want)
			}
		})
	}
}

// TestSignerKeygenKeepsExistingKeys: keygen never writes over a key file. The old private key
// would be lost (its registered signer's images could no longer be re-signed), and a file that
// existed keeps its mode: a new private key written into a world-readable file.
func TestSignerKeygenKeepsExistingKeys(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing string // file of the pair that exists before
	}{
		{"private key exists", ".key"},
		{"public key exists", ".pub"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "signer")
			if err := os.WriteFile(prefix+tc.existing, []byte("old\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			code, _, errs := run(t, nil, "signer", "keygen", "--out", prefix)
			if code != 2 || !strings.Contains(errs, prefix+tc.existing+" exists") {
				t.Errorf("keygen over %s: %d %q", tc.existing, code, errs)
			}
			if b, _ := os.ReadFile(prefix + tc.existing); string(b) != "old\n" {
				t.Errorf("%s replaced: %q", tc.existing, b)
			}
			for _, other := range []string{".key", ".pub"} {
				if _, err := os.Stat(prefix + other); other != tc.existing && err == nil {
					t.Errorf("%s written beside an existing %s", other, tc.existing)
				}
			}
		})
	}
	prefix := filepath.Join(t.TempDir(), "new")
	if code, _, errs := run(t, nil, "signer", "keygen", "--out", prefix); code != 0 {
		t.Fatalf("keygen: %q", errs)
	}
	if st, err := os.Stat(prefix + ".key"); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key: %v %v, want mode 0600", st, err)
	}
}

// TestCommandsSayWhatTheyDid: a command whose call answers nothing still says it worked, and
// with -o json prints a JSON object a script can parse.
func TestCommandsSayWhatTheyDid(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	prefix := filepath.Join(t.TempDir(), "k")
	if code, _, errs := run(t, env, "signer", "keygen", "--out", prefix); code != 0 {
		t.Fatal(errs)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"site", "create", "s1"}, "s1"},
		{[]string{"site", "delete", "s1"}, "deleted site s1\n"},
		{[]string{"site", "create", "s2"}, "s2"},
		{[]string{"site", "delete", "s2", "-o", "json"}, "{}\n"},
		{[]string{"pool", "create", "p1"}, "p1"},
		{[]string{"pool", "delete", "p1"}, "deleted pool p1\n"},
		{[]string{"pool", "create", "p2"}, "p2"},
		{[]string{"pool", "delete", "p2", "-o", "json"}, "{}\n"},
		{[]string{"signer", "add", "lab", "--public-key-file", prefix + ".pub"}, "signer lab registered\n"},
		{[]string{"signer", "revoke", "lab"}, "signer lab revoked"},
	} {
		code, out, errs := run(t, env, tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %d %q %q, want it to say %q", tc.args, code, out, errs, tc.want)
		}
	}
	empty := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run(t, env, "node", "enroll", "n1", "--bmc-address", "https://10.0.0.2", "--bmc-username", "root", "--bmc-password-file", empty)
	if code != 2 || !strings.Contains(errs, "password file "+empty+" is empty") {
		t.Errorf("enroll with an empty password file: %d %q", code, errs)
	}
}

// TestVerifyFileDigestShowsProgress: hashing a local image (gigabytes) says how far it is on
// stderr; the verdict goes to stdout.
func TestVerifyFileDigestShowsProgress(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.raw")
	data := bytes.Repeat([]byte{0x5a}, 3<<20)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	for _, tc := range []struct {
		name, sha256, wantErr string
	}{
		{"matches", hex.EncodeToString(sum[:]), ""},
		{"differs", strings.Repeat("0", 64), "differs from the catalog's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, status bytes.Buffer
			err := verifyFileDigest(&out, &status, path, catalog.Image{Name: "i", SHA256: tc.sha256})
			if tc.wantErr == "" && (err != nil || !strings.Contains(out.String(), "digest matches the catalog")) ||
				tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("got %v, stdout %q", err, out.String())
			}
			if !strings.Contains(status.String(), "hashing "+path+": 3 of 3 MiB (100%)") {
				t.Errorf("progress: %q", status.String())
			}
		})
	}
}

// TestBulkNeedsWhatTheAPINeeds: bcd bulk refuses, in its flags' terms and before any call, what
// the API would refuse: no pool, no nodes or both kinds, no reason.
func TestBulkNeedsWhatTheAPINeeds(t *testing.T) {
	env := map[string]string{"BCD_SERVER": "http://127.0.0.1:1"} // nothing listens: any call would fail otherwise
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bulk", "retire", "--nodes", "n1", "--reason", "x"}, "--pool P is required"},
		{[]string{"bulk", "retire", "--pool", "p", "--reason", "x"}, "give either --nodes a,b,… or --selector key=value (not both)"},
		{[]string{"bulk", "deploy", "--pool", "p", "--count", "2", "--nodes", "n1", "--image", "i", "--reason", "x"}, "--count takes nodes from the pool by itself"},
		{[]string{"bulk", "deploy", "--pool", "p", "--count", "10001", "--image", "i", "--reason", "x"}, "--count 10001: from 1 to 10000"},
		{[]string{"bulk", "deploy", "--pool", "p", "--selector", "rack=r1", "--spread", "rack", "--image", "i", "--reason", "x"}, "--spread applies with deploy --count N only"},
		{[]string{"bulk", "retire", "--pool", "p", "--nodes", " , ", "--reason", "x"}, "give either --nodes a,b,… or --selector key=value (not both)"},
		{[]string{"bulk", "retire", "--pool", "p", "--nodes", "n1", "--selector", "rack=r1", "--reason", "x"}, "give either --nodes a,b,… or --selector key=value (not both)"},
		{[]string{"bulk", "retire", "--pool", "p", "--nodes", "n1"}, "--reason WHY is required: approvers read it"},
		{[]string{"bulk", "retire", "--pool", "p", "--selector", "rack=r1", "--reason", "  "}, "--reason WHY is required: approvers read it"},
	} {
		code, _, errs := run(t, env, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: %d %q, want %q", tc.args, code, errs, tc.want)
		}
	}
}

// TestFlagErrorsPointAtTheHelp: a mistyped flag or a value of the wrong type says where the
// command's flags are listed.
func TestFlagErrorsPointAtTheHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "list", "--stat", "ready"}, "unknown flag: --stat (bcd node list --help lists its flags)"},
		{[]string{"events", "--after", "abc"}, `invalid argument "abc" for "--after" flag`},
		{[]string{"events", "--after", "abc"}, "(bcd events --help lists its flags)"},
		{[]string{"site", "join-token", "s", "--ttl", "1 hour"}, "(bcd site join-token --help lists its flags)"},
	} {
		code, _, errs := run(t, map[string]string{"BCD_SERVER": "http://127.0.0.1:1"}, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: %d %q, want %q", tc.args, code, errs, tc.want)
		}
	}
}
