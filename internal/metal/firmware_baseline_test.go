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

// components is a baseline of n valid components.
func components(n int) map[string]string {
	b := map[string]string{}
	for i := range n {
		b[fmt.Sprintf("c%d", i)] = "1.0"
	}
	return b
}

// A pool's firmware baseline is bounded: at most 64 components, named as BMCs name firmware
// (Redfish inventory ids), each with a version of 1-63 printable ASCII characters; the error names the field and
// what is accepted, and quotes no more than 80 characters of what was given.
func TestValidFirmwareBaseline(t *testing.T) {
	long := strings.Repeat("v", 1<<20)
	cases := []struct {
		name     string
		baseline map[string]string
		want     string // in the error; "" for valid
	}{
		{"none", nil, ""},
		{"empty", map[string]string{}, ""},
		{"vendor versions", map[string]string{"bios": "2.17.1", "bmc": "6.10.30.00", "nic.mlx5/fw": "22.36.1010",
			"system_rom": "U46 v2.50 (03/01/2023)", "cpld": "1:2.3-4+b1~rc.1"}, ""},
		{"64 components", components(64), ""},
		{"65 components", components(65), "65 components: at most 64 are accepted"},
		{"ten thousand components", components(10000), "10000 components: at most 64"},
		{"component of 63 characters", map[string]string{strings.Repeat("c", 63): "1"}, ""},
		{"component of 64 characters", map[string]string{strings.Repeat("c", 64): "1"}, "is not valid: use 1-63 characters of A-Z, a-z"},
		{"empty component", map[string]string{"": "1"}, `component "" is not valid`},
		{"Redfish inventory ids", map[string]string{"BIOS": "1", "Installed-25227-6.10.30.20__iDRAC.Embedded.1-1": "6.10.30.20", "NIC.Slot.1-1-1": "22.31.6"}, ""},
		{"component with a quote", map[string]string{`bi"os`: "1"}, `component "bi\"os" is not valid`},
		{"component with a space", map[string]string{"system rom": "1"}, `component "system rom" is not valid`},
		{"component ending in a dot", map[string]string{"bios.": "1"}, `component "bios." is not valid`},
		{"huge component", map[string]string{long: "1"}, "…\" is not valid"},
		{"version of 1 character", map[string]string{"bios": "7"}, ""},
		{"version of 63 characters", map[string]string{"bios": strings.Repeat("9", 63)}, ""},
		{"version of 64 characters", map[string]string{"bios": strings.Repeat("9", 64)}, "of component bios is not valid: use 1-63 printable ASCII"},
		{"empty version", map[string]string{"bios": ""}, `required version "" of component bios is not valid`},
		{"version with a newline", map[string]string{"bios": "2.1\n"}, `"2.1\n" of component bios`},
		{"version with a tab", map[string]string{"bios": "2.1\t3"}, "of component bios is not valid"},
		{"version starting with a space", map[string]string{"bios": " 2.1"}, "not starting or ending with a space"},
		{"version ending with a space", map[string]string{"bios": "2.1 "}, "not starting or ending with a space"},
		{"non-ASCII version", map[string]string{"bios": "2.1–β"}, "of component bios is not valid"},
		{"huge version", map[string]string{"bios": long}, "…\" of component bios"},
		{"first bad component by name", map[string]string{"a": "1", "b": "", "c": ""}, "of component b is"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ValidFirmwareBaseline("policy.firmware_baseline", c.baseline)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "policy.firmware_baseline" || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want invalid policy.firmware_baseline saying %q", err, c.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes: it quotes what was given whole", len(err.Error()))
			}
		})
	}
}

// Creating and updating a pool check its firmware baseline; a refused update leaves the policy
// as it was.
func TestPoolFirmwareBaselineBounds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		pol := store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: components(65)}
		var inv *InvalidError
		if _, err := f.svc.CreatePool(ctx, f.admin, "fw", "default", pol); !errors.As(err, &inv) || inv.Field != "policy.firmware_baseline" {
			t.Fatalf("creating a pool with 65 baseline components: %v", err)
		}
		pol.FirmwareBaseline = map[string]string{"bios": "2.17.1"}
		if _, err := f.svc.CreatePool(ctx, f.admin, "fw", "default", pol); err != nil {
			t.Fatal(err)
		}
		bad := pol
		bad.FirmwareBaseline = map[string]string{"bios": strings.Repeat("9", 64)}
		if _, err := f.svc.UpdatePool(ctx, f.admin, "fw", bad); !errors.As(err, &inv) || inv.Field != "policy.firmware_baseline" {
			t.Fatalf("updating a pool with a version of 64 characters: %v", err)
		}
		got, err := st.Pool(ctx, "fw")
		if err != nil || got.Policy.FirmwareBaseline["bios"] != "2.17.1" || len(got.Policy.FirmwareBaseline) != 1 {
			t.Fatalf("pool after a refused update: %+v (%v)", got.Policy, err)
		}
	})
}
