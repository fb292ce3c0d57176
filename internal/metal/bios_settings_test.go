package metal

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// attributes is a BIOS settings map of n valid attributes.
func attributes(n int) map[string]string {
	b := map[string]string{}
	for i := range n {
		b[fmt.Sprintf("Attr%d", i)] = "Enabled"
	}
	return b
}

// A pool's BIOS settings are bounded: at most 128 attributes named as Redfish names them, each
// value printable ASCII text of at most 255 characters; passwords are refused. The error names
// the field and what is accepted, and quotes no more than 80 characters of what was given.
func TestValidBIOSSettings(t *testing.T) {
	long := strings.Repeat("v", 1<<20)
	cases := []struct {
		name     string
		settings map[string]string
		want     string // in the error; "" for valid
	}{
		{"none", nil, ""},
		{"vendor attributes", map[string]string{"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Enabled", "ProcCoreDisable": "0",
			"EmbNicPxe": "true", "BootMode": "Uefi", "Proc1SmtEnable": "Disabled", "NumLock": "On", "AssetTag": ""}, ""},
		{"128 attributes", attributes(128), ""},
		{"129 attributes", attributes(129), "129 attributes: at most 128 are accepted"},
		{"name of 64 characters", map[string]string{"A" + strings.Repeat("b", 63): "x"}, ""},
		{"name of 65 characters", map[string]string{"A" + strings.Repeat("b", 64): "x"}, "is not valid: use 1-64 characters"},
		{"empty name", map[string]string{"": "x"}, `attribute "" is not valid`},
		{"name starting with a digit", map[string]string{"1Proc": "x"}, `attribute "1Proc" is not valid`},
		{"name with a dot", map[string]string{"Proc.Virt": "x"}, `attribute "Proc.Virt" is not valid`},
		{"name with a quote", map[string]string{`Pr"oc`: "x"}, `attribute "Pr\"oc" is not valid`},
		{"huge name", map[string]string{long: "x"}, "…\" is not valid"},
		{"password", map[string]string{"AdminPassword": "hunter2"}, "attribute AdminPassword is a password"},
		{"password any case", map[string]string{"SetupPASSWORDHash": "x"}, "is a password"},
		{"value of 255 characters", map[string]string{"AssetTag": strings.Repeat("t", 255)}, ""},
		{"value of 256 characters", map[string]string{"AssetTag": strings.Repeat("t", 256)}, "value of attribute AssetTag is not valid: use 0-255 printable ASCII"},
		{"value with a newline", map[string]string{"AssetTag": "a\nb"}, "value of attribute AssetTag is not valid"},
		{"non-ASCII value", map[string]string{"AssetTag": "rack–β"}, "value of attribute AssetTag is not valid"},
		{"first bad attribute by name", map[string]string{"A": "x", "B": "\x00", "C": "\x00"}, "value of attribute B is"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ValidBIOSSettings("policy.bios_settings", c.settings)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "policy.bios_settings" || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want invalid policy.bios_settings saying %q", err, c.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes: it quotes what was given whole", len(err.Error()))
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error %v quotes a password", err)
			}
		})
	}
}

// Creating and updating a pool check its BIOS settings, and refuse them where the pool's
// hardware profile drives BMCs with ipmi; a refused update leaves the policy as it was.
func TestPoolBIOSSettings(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		var inv *InvalidError
		pol := store.PoolPolicy{HardwareProfile: "ipmi", BIOSSettings: map[string]string{"ProcVirtualization": "Enabled"}}
		if _, err := f.svc.CreatePool(ctx, f.admin, "bios", "default", pol); !errors.As(err, &inv) || inv.Field != "policy.bios_settings" || !strings.Contains(err.Error(), "ipmi") {
			t.Fatalf("creating an ipmi pool with BIOS settings: %v", err)
		}
		pol.HardwareProfile = "redfish"
		if _, err := f.svc.CreatePool(ctx, f.admin, "bios", "default", pol); err != nil {
			t.Fatal(err)
		}
		for _, bad := range []map[string]string{attributes(129), {"BiosPassword": "x"}} {
			p := pol
			p.BIOSSettings = bad
			if _, err := f.svc.UpdatePool(ctx, f.admin, "bios", p); !errors.As(err, &inv) || inv.Field != "policy.bios_settings" {
				t.Fatalf("updating a pool with BIOS settings %d long: %v", len(bad), err)
			}
		}
		p := pol
		p.HardwareProfile = "ipmi"
		if _, err := f.svc.UpdatePool(ctx, f.admin, "bios", p); !errors.As(err, &inv) || inv.Field != "policy.bios_settings" {
			t.Fatalf("moving a pool with BIOS settings to ipmi: %v", err)
		}
		got, err := st.Pool(ctx, "bios")
		if err != nil || got.Policy.BIOSSettings["ProcVirtualization"] != "Enabled" || len(got.Policy.BIOSSettings) != 1 || got.Policy.HardwareProfile != "redfish" {
			t.Fatalf("pool after refused updates: %+v (%v)", got.Policy, err)
		}
	})
}
