package site_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	"bcd/internal/pki"
	"bcd/internal/site"
)

// TestAgentRotatesBMCCredential: bmc.rotate applies the new password through the driver's
// credential operation on a virtual Redfish BMC (AccountService PATCH) and a virtual IPMI BMC
// (Set User Password), logs in with it, and the result is signed by the site agent (the control
// plane verifies it as a site statement); the BMC then takes the new password only. A BMC that
// ignores the write fails the command, naming what happened, and the password never appears.
func TestAgentRotatesBMCCredential(t *testing.T) {
	env := startGateway(t)
	logs := &syncBuffer{}
	log := logger(t, logs)
	ag := startAgent(t, agentConfig(t, env, "rot", t.TempDir(), log), "rot")
	cert := ag.certDER(t)

	rfURL, fp := redfishBMC(t, vbmc.NewFakeMachine(), bmcUser, bmcPass, nil, log)
	ipmiAddr, ipmiDev := ipmiBMCDev(t, vbmc.NewFakeMachine(), bmcUser, bmcPass)
	refs := map[string]map[string]any{
		"redfish": {"driver": "redfish", "address": rfURL, "usernameRef": "secret://u", "passwordRef": "secret://p", "fingerprintSha256": fp},
		"ipmi":    {"driver": "ipmi", "address": ipmiAddr, "usernameRef": "secret://u", "passwordRef": "secret://p"},
	}
	const newPass = "N3w-Pa55.rotated-x"
	for _, drv := range []string{"redfish", "ipmi"} {
		t.Run(drv, func(t *testing.T) {
			id := "rot-" + drv
			u := do(t, env, ag, id, site.KindBMCRotate, "n1", map[string]any{"nodeId": "n1", "bmc": refs[drv],
				"credentials": credentials(t, cert, bmcUser, bmcPass), "newCredentials": credentials(t, cert, bmcUser, newPass)})
			if u.State != gateway.StateSucceeded || string(u.Result) != `{"verified":true}` {
				t.Fatalf("rotate: %s %q %s", u.State, u.Error, u.Result)
			}
			st := pki.Statement{CommandID: id, NodeID: "n1", Kind: site.KindBMCRotate, ResultSHA256: pki.ResultDigest(u.Result)}
			if err := pki.VerifySiteStatement(env.CA, u.SignerCertDER, st, u.NodeSig, testSite, time.Now()); err != nil {
				t.Fatalf("the result is not site-signed: %v", err)
			}
			// The BMC now takes the new password and refuses the old one.
			if u := do(t, env, ag, id+"-new", site.KindBMCQuery, "n1", map[string]any{"nodeId": "n1", "bmc": refs[drv],
				"credentials": credentials(t, cert, bmcUser, newPass), "query": "power"}); u.State != gateway.StateSucceeded {
				t.Fatalf("login with the new password: %s %q", u.State, u.Error)
			}
			if u := do(t, env, ag, id+"-old", site.KindBMCQuery, "n1", map[string]any{"nodeId": "n1", "bmc": refs[drv],
				"credentials": credentials(t, cert, bmcUser, bmcPass), "query": "power"}); u.State != gateway.StateFailed {
				t.Fatalf("login with the old password after rotation: %s", u.State)
			}
		})
	}

	t.Run("ipmi BMC ignores the write", func(t *testing.T) {
		ipmiDev.IgnorePasswordWrites(true)
		u := do(t, env, ag, "rot-ignored", site.KindBMCRotate, "n1", map[string]any{"nodeId": "n1", "bmc": refs["ipmi"],
			"credentials": credentials(t, cert, bmcUser, newPass), "newCredentials": credentials(t, cert, bmcUser, "An0ther-Pa55.word")})
		// The driver names what happened ("still accepts only the old password"; on a slow
		// machine the check of the old password may time out instead): failed either way.
		if u.State != gateway.StateFailed || !strings.Contains(u.Error, "rotating credential") {
			t.Fatalf("rotation on a BMC that ignores it: %s %q", u.State, u.Error)
		}
	})
	t.Run("new credential missing", func(t *testing.T) {
		u := do(t, env, ag, "rot-missing", site.KindBMCRotate, "n1", map[string]any{"nodeId": "n1", "bmc": refs["redfish"],
			"credentials": credentials(t, cert, bmcUser, newPass)})
		if u.State != gateway.StateFailed || !strings.Contains(u.Error, "newCredentials are missing") {
			t.Fatalf("%s %q", u.State, u.Error)
		}
	})
	for _, secret := range []string{bmcPass, newPass, "An0ther-Pa55.word"} {
		if strings.Contains(logs.String(), secret) {
			t.Fatal("a BMC password appears in the logs")
		}
	}
}

// ipmiBMCDev is ipmiBMC that also returns the device (for its test hooks).
func ipmiBMCDev(t *testing.T, m vbmc.Machine, user, pass string) (string, *ipmibmc.BMC) {
	t.Helper()
	b, err := ipmibmc.New(ipmibmc.Config{Addr: "127.0.0.1:0", Username: user, Password: pass,
		GUID: "66666666-7777-8888-9999-000000000001"}, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("ipmi bmc: %v", err)
		}
	})
	return b.Addr().String(), b
}
