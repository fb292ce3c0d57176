package metal

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"bcd/internal/catalog"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A pool's firmware images each name a component of its baseline and a signed catalog image of
// format firmware; an ipmi profile cannot have them. A firmware image is never deployed.
func TestPoolFirmwareImages(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		pub, key, _ := ed25519.GenerateKey(nil)
		if err := f.svc.AddSigner(ctx, f.admin, "fw-signer", pub); err != nil {
			t.Fatal(err)
		}
		img := catalog.Image{Name: "bios-2", URL: "http://images.test/bios-2.bin", Size: 10, Format: catalog.FormatFirmware, Compression: "none",
			SHA256: strings.Repeat("b", 64), Signer: "fw-signer"}
		img.Signature = catalog.Sign(img, key)
		if err := f.svc.AddImage(ctx, f.admin, img); err != nil {
			t.Fatal(err)
		}
		baseline := map[string]string{"BIOS": "2.0"}
		var inv *InvalidError
		for _, tc := range []struct {
			name string
			pol  store.PoolPolicy
			want string // "" valid
		}{
			{"valid", store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: baseline, FirmwareImages: map[string]string{"BIOS": "bios-2"}}, ""},
			{"component not in the baseline", store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: baseline, FirmwareImages: map[string]string{"BMC": "bios-2"}},
				`component "BMC" has no version in firmware_baseline`},
			{"no such image", store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: baseline, FirmwareImages: map[string]string{"BIOS": "nope"}},
				`no catalog image named "nope"`},
			{"a disk image", store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: baseline, FirmwareImages: map[string]string{"BIOS": "debian"}},
				"image debian is a raw image: use one registered with --format firmware"},
			{"ipmi profile", store.PoolPolicy{HardwareProfile: "ipmi", FirmwareBaseline: baseline, FirmwareImages: map[string]string{"BIOS": "bios-2"}},
				"drives its BMCs with ipmi, which cannot install firmware"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := f.svc.UpdatePool(ctx, f.admin, "default", tc.pol)
				if tc.want == "" {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					return
				}
				if !errors.As(err, &inv) || inv.Field != "policy.firmware_images" || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want invalid policy.firmware_images saying %q", err, tc.want)
				}
			})
		}
		got, err := st.Pool(ctx, "default")
		if err != nil || got.Policy.FirmwareImages["BIOS"] != "bios-2" {
			t.Fatalf("the valid policy was not kept through the refusals: %+v (%v)", got.Policy, err)
		}
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.svc.Apply(ctx, f.admin, provision.VerbDeploy, VerbInput{Node: "n1", Image: "bios-2"}); !errors.As(err, &inv) || inv.Field != "image" || !strings.Contains(err.Error(), "bios-2 is a firmware image") {
			t.Fatalf("deploying a firmware image: %v", err)
		}
	})
}
