package netboot

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// withheldLog records the withheld requests it is told of.
type withheldLog struct{ got []string }

func (w *withheldLog) RecordWithheld(mac net.HardwareAddr, remote netip.Addr, _ time.Time) {
	w.got = append(w.got, mac.String()+" "+remote.String())
}

// fakeBindings: MAC → the address the site's DHCP saw it take.
type fakeBindings map[string]netip.Addr

func (f fakeBindings) BootsFrom(mac net.HardwareAddr, addr netip.Addr) bool {
	a, ok := f[mac.String()]
	return ok && a == addr
}

// TestScriptGoesOnlyToTheBoundAddress: with Bindings, a MAC's script (and its token) goes only to
// the address the site's DHCP saw that MAC take; any other requester gets a script that asks
// DHCP again and retries, without the token. Machines with no entry are not concerned.
func TestScriptGoesOnlyToTheBoundAddress(t *testing.T) {
	entries := fakeEntries{"52:54:00:12:34:56": ramdiskEntry(), "52:54:00:00:00:02": ramdiskEntry()}
	disc := &fakeDiscovery{}
	withheld := &withheldLog{}
	h, err := NewHandler(HandlerConfig{BaseURL: "http://10.0.0.1:8080", Entries: entries, Discovery: disc, Withheld: withheld,
		Artifacts: fakeArtifacts{shaK: true, shaI: true}, Now: func() time.Time { return fixedNow },
		Bindings: fakeBindings{"52:54:00:12:34:56": netip.MustParseAddr("10.0.0.77")}})
	if err != nil {
		t.Fatal(err)
	}
	const q = "/boot.ipxe?mac=52:54:00:12:34:56&arch=x86_64"
	tests := []struct {
		name, target, remote string
		served               bool
	}{
		{"from the bound address", q, "10.0.0.77:1234", true},
		{"from the bound address, IPv4-mapped", q, "[::ffff:10.0.0.77]:1234", true},
		{"from another host", q, "10.0.0.99:1234", false},
		{"for a MAC the DHCP never saw", "/boot.ipxe?mac=52:54:00:00:00:02&arch=x86_64", "10.0.0.77:1234", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := get(h, tc.target, tc.remote).Body.String()
			if got := strings.Contains(body, "bcd.token="+tok); got != tc.served {
				t.Fatalf("token served %t, want %t:\n%s", got, tc.served, body)
			}
			if tc.served {
				return
			}
			for _, want := range []string{string(WaitAddress), "sleep 10\n", "dhcp netX ||\n", "chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac="} {
				if !strings.Contains(body, want) {
					t.Fatalf("withheld script lacks %q:\n%s", want, body)
				}
			}
			if strings.Contains(body, tok) || strings.Contains(body, "kernel ") {
				t.Fatalf("withheld script boots or names the token:\n%s", body)
			}
		})
	}
	// Each withheld request is recorded with its address (IPv4-mapped ones unmapped); served
	// ones are not.
	if want := []string{"52:54:00:12:34:56 10.0.0.99", "52:54:00:00:00:02 10.0.0.77"}; !slices.Equal(withheld.got, want) {
		t.Fatalf("withheld %v, want %v", withheld.got, want)
	}
	// A machine with no entry is unaffected: it is recorded and waits, wherever it asks from.
	if body := get(h, "/boot.ipxe?mac=52:54:00:99:99:99&arch=x86_64", "10.0.0.99:1").Body.String(); !strings.Contains(body, string(WaitNoEntry)) || len(disc.seen) != 1 {
		t.Fatalf("no-entry machine: %d discoveries\n%s", len(disc.seen), body)
	}
}

// The discovery decision carries the same one-time token as the boot script: with Bindings it
// goes only to the MAC's bound address too, and another host's request is withheld and recorded.
func TestDecisionGoesOnlyToTheBoundAddress(t *testing.T) {
	entries := fakeEntries{"52:54:00:12:34:56": ramdiskEntry()}
	withheld := &withheldLog{}
	h, err := NewHandler(HandlerConfig{BaseURL: "http://10.0.0.1:8080", Entries: entries, Discovery: &fakeDiscovery{}, Withheld: withheld,
		Artifacts: fakeArtifacts{shaK: true, shaI: true}, Now: func() time.Time { return fixedNow },
		Bindings: fakeBindings{"52:54:00:12:34:56": netip.MustParseAddr("10.0.0.77")}})
	if err != nil {
		t.Fatal(err)
	}
	const q = DecisionPath + "?mac=52:54:00:12:34:56"
	for _, tc := range []struct {
		name, remote string
		served       bool
	}{
		{"from the bound address", "10.0.0.77:1234", true},
		{"from the bound address, IPv4-mapped", "[::ffff:10.0.0.77]:1234", true},
		{"from another host", "10.0.0.99:1234", false},
	} {
		rec := get(h, q, tc.remote)
		if got := strings.Contains(rec.Body.String(), "bcd.token="+tok); got != tc.served {
			t.Errorf("%s: token served %t, want %t (%d %q)", tc.name, got, tc.served, rec.Code, rec.Body.String())
		}
		if !tc.served && rec.Code != http.StatusNoContent {
			t.Errorf("%s: %d, want 204 (no decision it can act on)", tc.name, rec.Code)
		}
	}
	if want := []string{"52:54:00:12:34:56 10.0.0.99"}; !slices.Equal(withheld.got, want) {
		t.Fatalf("withheld %v, want %v", withheld.got, want)
	}
}
