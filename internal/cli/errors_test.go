package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/agentlink"
	"bcd/internal/gen/bcdv1"
)

func TestDescribe(t *testing.T) {
	joinRefused := fmt.Errorf("site agent: joining the control plane: joining as site agent: %w: %w", agentlink.ErrRefused,
		connect.NewError(connect.CodeUnauthenticated, errors.New("join token refused")))
	revoked := fmt.Errorf("site agent: %w: %w", agentlink.ErrRefused, connect.NewError(connect.CodePermissionDenied, errors.New("site agent a1: revoked")))
	for _, tc := range []struct {
		name, path string
		err        error
		want       string
	}{
		{"API token refused", "bcd node list", connect.NewError(connect.CodeUnauthenticated, errors.New("unknown token")),
			"unknown token (give a token with --token or BCD_TOKEN)"},
		{"server down", "bcd node list", connect.NewError(connect.CodeUnavailable, errors.New("connection refused")),
			"connection refused (is bcd server running at --server / BCD_SERVER?)"},
		{"other API error", "bcd node get", connect.NewError(connect.CodeNotFound, errors.New("node \"x\": not found")),
			"not_found: node \"x\": not found"},
		{"site agent's join token refused", "bcd site run", joinRefused,
			"join token refused (give a new join token with --join-token or $BCD_SITE_JOIN_TOKEN; mint one: bcd site join-token SITE)"},
		{"site agent's certificate refused", "bcd site run", revoked, "refused by the agent gateway: site agent a1: revoked"},
		{"another agent refused", "bcd ramdisk init", joinRefused, "refused by the agent gateway: join token refused"},
		{"not an API error", "bcd node list", errors.New("--server \"x\": use http://HOST:PORT"), "--server \"x\": use http://HOST:PORT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describe(tc.path, tc.err); got != tc.want {
				t.Errorf("describe(%q, %v)\n got %q\nwant %q", tc.path, tc.err, got, tc.want)
			}
		})
	}
}

// A site agent whose join token the gateway refuses is told how to give one, not to give an
// API token.
func TestSiteRunRefusedJoinToken(t *testing.T) {
	srv := newServer(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, srv.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run(t, map[string]string{}, "site", "run", "--server", srv.GatewayURL(), "--site", "default",
		"--join-token", "bcdj_notatokenthegatewayknows", "--ca-file", ca, "--data-dir", t.TempDir(),
		"--http-listen", "127.0.0.1:0", "--tftp-listen", "")
	if code != 5 || !strings.Contains(errs, "error: join token refused (give a new join token with --join-token or $BCD_SITE_JOIN_TOKEN") || strings.Contains(errs, "BCD_TOKEN)") {
		t.Fatalf("site run with a refused join token: %d\n%s", code, errs)
	}
}

// Bad input is refused before any call, saying which flag or argument and what is accepted.
func TestBadInputErrors(t *testing.T) {
	env := map[string]string{"BCD_SERVER": "http://127.0.0.1:1"} // nothing listens: any call would fail otherwise
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hwprofile", "put", "X", "--driver", "power"}, `--driver "power": use concern=driver, e.g. power=ipmi`},
		{[]string{"site", "create", "s", "--label", "rack"}, `--label "rack": use key=value`},
		{[]string{"node", "power", "n1"}, "bcd node power takes NODE and a power action: on, off, soft, cycle or reset; 1 given"},
		{[]string{"node", "maintenance", "n1"}, "bcd node maintenance takes NODE and on or off"},
		{[]string{"batch", "approve"}, "bcd batch approve takes the batch's ID (bcd batch list --state pending lists those waiting)"},
		{[]string{"batch", "reject"}, "bcd batch reject takes the batch's ID"},
		{[]string{"site", "join-token", "s", "--ttl", "200h"}, "--ttl 200h: accepted are 1m to 168h"},
		{[]string{"site", "join-token", "s", "--ttl", "30s"}, "--ttl 30s: accepted are 1m to 168h"},
		{[]string{"node", "accept", "52:54:00:00:00:01", "--name", "n"}, "give --bmc-address ADDR --bmc-username USER --bmc-password-file FILE (or env BCD_BMC_PASSWORD), or --inband"},
	} {
		code, _, errs := run(t, env, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: %d %q, want %q", tc.args, code, errs, tc.want)
		}
	}
}

func TestAcceptCredentials(t *testing.T) {
	full := func() *bcdv1.BmcCredentials {
		return &bcdv1.BmcCredentials{Address: "10.0.0.2:623", Username: "root"}
	}
	for _, tc := range []struct {
		name        string
		bmc         *bcdv1.BmcCredentials
		file        string
		envPassword bool
		want        string // "" accepted
	}{
		{"address, user, password file", full(), "pw", false, ""},
		{"address, user, password in the environment", full(), "", true, ""},
		{"inband", &bcdv1.BmcCredentials{Inband: true}, "", false, ""},
		{"inband with a user", &bcdv1.BmcCredentials{Inband: true, Username: "bcd"}, "", true, ""},
		{"inband with a password file", &bcdv1.BmcCredentials{Inband: true}, "pw", false, "drop --bmc-password-file"},
		{"nothing", &bcdv1.BmcCredentials{}, "", false, "give --bmc-address ADDR --bmc-username USER --bmc-password-file FILE (or env BCD_BMC_PASSWORD), or --inband"},
		{"no password", full(), "", false, "give --bmc-password-file FILE (or env BCD_BMC_PASSWORD), or --inband"},
		{"no user", &bcdv1.BmcCredentials{Address: "10.0.0.2"}, "pw", false, "give --bmc-username USER, or --inband"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := acceptCredentials(tc.bmc, tc.file, tc.envPassword)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheckJoinTokenTTL(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want string // "" accepted
	}{
		{time.Minute, ""},
		{time.Hour, ""},
		{168 * time.Hour, ""},
		{59 * time.Second, "--ttl 59s: accepted are 1m to 168h"},
		{0, "--ttl 0s: accepted are 1m to 168h"},
		{200 * time.Hour, "--ttl 200h: accepted are 1m to 168h"},
		{168*time.Hour + 30*time.Minute, "--ttl 168h30m: accepted are 1m to 168h"},
	} {
		err := checkJoinTokenTTL(tc.ttl)
		if got := fmt.Sprint(err); tc.want == "" && err != nil || tc.want != "" && got != tc.want {
			t.Errorf("checkJoinTokenTTL(%s) = %v, want %q", tc.ttl, err, tc.want)
		}
	}
}

func TestPairMap(t *testing.T) {
	for _, tc := range []struct {
		pairs []string
		want  string // "" accepted
	}{
		{nil, ""},
		{[]string{"power=ipmi", "boot=ipxe"}, ""},
		{[]string{"power=ipmi", "boot"}, `--driver "boot": use concern=driver`},
	} {
		m, err := pairMap("--driver", "concern=driver", tc.pairs)
		switch {
		case tc.want == "" && (err != nil || len(m) != len(tc.pairs)):
			t.Errorf("%v: %v %v", tc.pairs, m, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%v: got %v, want %q", tc.pairs, err, tc.want)
		}
	}
}
