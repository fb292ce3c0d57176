package metal

import (
	"context"
	"errors"
	"strings"
	"testing"

	"bcd/internal/catalog"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A BMC address that carries credentials is refused without being quoted back: the password in
// it must not reach an API response, an event or a log line.
func TestValidBMCAddressRefusesCredentialsWithoutQuotingThem(t *testing.T) {
	const secret = "BmcAddrSecret"
	cases := []struct {
		name, driver, addr string
	}{
		{"redfish user and password", "redfish", "https://root:" + secret + "@10.0.0.9"},
		{"redfish password with a percent", "redfish", "https://root:" + secret + "%zz@10.0.0.9"},
		{"redfish password with a slash", "redfish", "https://root:" + secret + "/x@10.0.0.9"},
		{"redfish password with a hash", "redfish", "https://root:" + secret + "#x@10.0.0.9:8443"},
		{"redfish user only", "redfish", "https://" + secret + "@10.0.0.9"},
		{"ipmi user and password", "ipmi", "root:" + secret + "@10.0.0.9"},
		{"ipmi user and password with a port", "ipmi", "root:" + secret + "@10.0.0.9:623"},
		{"ipmi as a URL", "ipmi", "ipmi://root:" + secret + "@10.0.0.9"},
		{"unknown driver", "other", "root:" + secret + "@10.0.0.9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ValidBMCAddress(c.driver, c.addr)
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "bmc.address" {
				t.Fatalf("error %v, want an InvalidError on bmc.address", err)
			}
			if msg := err.Error(); strings.Contains(msg, secret) || !strings.Contains(msg, "must not carry credentials") {
				t.Errorf("error %q: want it to refuse credentials without quoting them", msg)
			}
		})
	}
	// A secret pasted into the driver field does not come back either.
	if _, err := ValidBMCAddress(secret, "10.0.0.9"); err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "unknown driver") {
		t.Errorf("unknown driver: %v", err)
	}
	for _, c := range []struct{ driver, addr, want string }{
		{"redfish", "https://10.0.0.9", "https://10.0.0.9"},
		{"redfish", "https://bmc.example:8443/", "https://bmc.example:8443"},
		{"ipmi", "10.0.0.9:623", "10.0.0.9:623"},
	} {
		if got, err := ValidBMCAddress(c.driver, c.addr); err != nil || got != c.want {
			t.Errorf("ValidBMCAddress(%s, %s) = %q, %v; want %q", c.driver, c.addr, got, err, c.want)
		}
	}
}

// A catalog image's URL reaches the image.put event with its query (a signed URL's token)
// redacted; a URL with a user or password is refused without being quoted back, and no event
// or log line holds it.
func TestAddImageKeepsURLSecretsOutOfEventsAndLogs(t *testing.T) {
	const secret = "ImageURLSecret"
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		cases := []struct {
			name, url string
			want      string // the event's url, or in the error when refused
			refused   bool
		}{
			{"signed with a query token", "https://repo.example/debian.raw?sig=" + secret, "https://repo.example/debian.raw?[redacted]", false},
			{"plain", "https://repo.example/debian.raw", "https://repo.example/debian.raw", false},
			{"user and password", "https://deploy:" + secret + "@repo.example/debian.raw?sig=" + secret, "must not carry a user or password", true},
			{"password that does not parse", "https://deploy:" + secret + "%zz@repo.example/debian.raw", "does not parse", true},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				img := catalog.Image{Name: strings.ReplaceAll(c.name, " ", "-"), URL: c.url, Size: 10, Format: "raw", Compression: "none", SHA256: strings.Repeat("a", 64)}
				err := f.svc.AddImage(ctx, f.admin, img)
				if c.refused {
					var inv *InvalidError
					if !errors.As(err, &inv) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), secret) {
						t.Fatalf("error %v: want an InvalidError saying %q, without the secret", err, c.want)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				evs, err := f.svc.Events(ctx, f.admin, "", 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				var data string
				for _, e := range evs {
					if e.Kind == "image.put" && strings.Contains(e.Data, `"`+img.Name+`"`) {
						data = e.Data
					}
				}
				if !strings.Contains(data, `"url":"`+c.want+`"`) {
					t.Errorf("image.put data %q: want url %q", data, c.want)
				}
			})
		}
		evs, err := f.svc.Events(ctx, f.admin, "", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if strings.Contains(e.Data, secret) || strings.Contains(e.Reason, secret) {
				t.Errorf("event %s holds the secret: %s", e.Kind, e.Data)
			}
		}
		if strings.Contains(f.logs.String(), secret) {
			t.Errorf("logs hold the secret:\n%s", f.logs.String())
		}
	})
}

// A BMC address with a query or a fragment (where a pasted URL carries a session token or a
// password) is refused without being quoted back, for both drivers; so is an in-band
// username, which is sealed like the password.
func TestBMCInputErrorsDoNotQuoteCredentials(t *testing.T) {
	const secret = "BmcQuerySecret"
	for _, c := range []struct{ name, driver, addr string }{
		{"redfish query", "redfish", "https://10.0.0.9/?password=" + secret},
		{"redfish query without a path", "redfish", "https://10.0.0.9?X-Auth-Token=" + secret},
		{"redfish fragment", "redfish", "https://10.0.0.9/redfish/v1/Systems/1#" + secret},
		{"redfish without a scheme", "redfish", "10.0.0.9?password=" + secret},
		{"ipmi query", "ipmi", "10.0.0.9?password=" + secret},
		{"ipmi query after the port", "ipmi", "10.0.0.9:623?password=" + secret},
		{"ipmi as a URL with a query", "ipmi", "ipmi://10.0.0.9/?password=" + secret},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ValidBMCAddress(c.driver, c.addr)
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "bmc.address" {
				t.Fatalf("error %v, want an InvalidError on bmc.address", err)
			}
			if msg := err.Error(); strings.Contains(msg, secret) || !strings.Contains(msg, "query") {
				t.Errorf("error %q: want it to refuse the query or fragment without quoting it", msg)
			}
		})
	}
	_, err := inbandBMC(BMCInput{Inband: true, Username: "root-" + secret}, true)
	var inv *InvalidError
	if !errors.As(err, &inv) || inv.Field != "bmc.username" || strings.Contains(err.Error(), secret) {
		t.Errorf("in-band username too long: %v: want an InvalidError on bmc.username without the value", err)
	}
}
