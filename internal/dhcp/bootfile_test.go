package dhcp

import (
	"errors"
	"fmt"
	"testing"

	"github.com/insomniacslk/dhcp/iana"
)

func TestBootFileTable(t *testing.T) {
	std := Policy{EFIBinary: BinaryEFI}
	snp := Policy{EFIBinary: BinarySNPOnly, HaveARM64: true}
	a := func(x iana.Arch) []iana.Arch { return []iana.Arch{x} }
	tests := []struct {
		name  string
		archs []iana.Arch
		uc    []string
		vc    string
		p     Policy
		want  BootChoice
		errIs error
	}{
		{"bios pxe", a(iana.INTEL_X86PC), nil, "PXEClient:Arch:00000:UNDI:002001", std, BootChoice{FirmwareBIOS, MethodTFTP, BinaryBIOS, VendorPXEClient}, nil},
		{"efi bc pxe", a(iana.EFI_BC), nil, "PXEClient:Arch:00007:UNDI:003016", std, BootChoice{FirmwareEFIx64, MethodTFTP, BinaryEFI, VendorPXEClient}, nil},
		{"efi x64 pxe", a(iana.EFI_X86_64), nil, "PXEClient:Arch:00009:UNDI:003016", std, BootChoice{FirmwareEFIx64, MethodTFTP, BinaryEFI, VendorPXEClient}, nil},
		{"efi x64 snponly", a(iana.EFI_X86_64), nil, "PXEClient", snp, BootChoice{FirmwareEFIx64, MethodTFTP, BinarySNPOnly, VendorPXEClient}, nil},
		{"efi x64 http", a(iana.EFI_X86_64_HTTP), nil, "HTTPClient:Arch:00016:UNDI:003001", std, BootChoice{FirmwareEFIx64, MethodHTTP, BinaryEFI, VendorHTTP}, nil},
		{"arm64 pxe present", a(iana.EFI_ARM64), nil, "PXEClient:Arch:00011:UNDI:003000", snp, BootChoice{FirmwareEFIarm64, MethodTFTP, BinaryARM64, VendorPXEClient}, nil},
		{"arm64 http present", a(iana.EFI_ARM64_HTTP), nil, "HTTPClient:Arch:00019", snp, BootChoice{FirmwareEFIarm64, MethodHTTP, BinaryARM64, VendorHTTP}, nil},
		{"arm64 pxe absent", a(iana.EFI_ARM64), nil, "PXEClient:Arch:00011", std, BootChoice{}, ErrUnsupported},
		{"arm64 http absent", a(iana.EFI_ARM64_HTTP), nil, "HTTPClient:Arch:00019", std, BootChoice{}, ErrUnsupported},
		{"ipxe efi", a(iana.EFI_BC), []string{"iPXE"}, "PXEClient:Arch:00007:UNDI:003010", std, BootChoice{FirmwareEFIx64, MethodScript, "", VendorPXEClient}, nil},
		{"ipxe bios", a(iana.INTEL_X86PC), []string{"iPXE"}, "PXEClient:Arch:00000:UNDI:002001", std, BootChoice{FirmwareBIOS, MethodScript, "", VendorPXEClient}, nil},
		{"ipxe arm64 without binary", a(iana.EFI_ARM64), []string{"iPXE"}, "PXEClient", std, BootChoice{FirmwareEFIarm64, MethodScript, "", VendorPXEClient}, nil},
		{"ipxe no vendor", nil, []string{"other", "iPXE"}, "", std, BootChoice{FirmwareOther, MethodScript, "", ""}, nil},
		{"plain client", nil, nil, "", std, BootChoice{}, ErrNotNetboot},
		{"windows client", nil, nil, "MSFT 5.0", std, BootChoice{}, ErrNotNetboot},
		{"udhcpc", nil, []string{"udhcp"}, "udhcp 1.36.1", std, BootChoice{}, ErrNotNetboot},
		{"lowercase pxeclient", a(iana.INTEL_X86PC), nil, "pxeclient", std, BootChoice{}, ErrNotNetboot},
		{"bios http", a(iana.INTEL_X86PC), nil, "HTTPClient", std, BootChoice{}, ErrUnsupported},
		{"ia32 efi", a(iana.EFI_IA32), nil, "PXEClient:Arch:00006", std, BootChoice{}, ErrUnsupported},
		{"arm32 efi", a(iana.EFI_ARM32), nil, "PXEClient:Arch:00010", std, BootChoice{}, ErrUnsupported},
		{"pxe without arch", nil, nil, "PXEClient", std, BootChoice{}, ErrUnsupported},
		{"first arch counts", []iana.Arch{iana.EFI_X86_64, iana.INTEL_X86PC}, nil, "PXEClient", std, BootChoice{FirmwareEFIx64, MethodTFTP, BinaryEFI, VendorPXEClient}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := BootFile(tt.archs, tt.uc, tt.vc, tt.p)
			if tt.errIs != nil {
				if !errors.Is(err, tt.errIs) {
					t.Fatalf("err = %v, want %v", err, tt.errIs)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestBootFileExhaustive walks every architecture code (and none) against every class
// combination and policy, and checks each answer against the rules independently stated here.
func TestBootFileExhaustive(t *testing.T) {
	family := map[iana.Arch]Firmware{
		0: FirmwareBIOS, 7: FirmwareEFIx64, 9: FirmwareEFIx64, 16: FirmwareEFIx64,
		11: FirmwareEFIarm64, 19: FirmwareEFIarm64,
	}
	userClasses := [][]string{nil, {"iPXE"}, {"gPXE"}, {"x", "iPXE"}, {"ipxe"}}
	vendors := []string{"", "PXEClient", "PXEClient:Arch:00000:UNDI:002001", "HTTPClient", "HTTPClient:Arch:00016", "MSFT 5.0", "pxeclient", "XPXEClient"}
	policies := []Policy{{EFIBinary: BinaryEFI}, {EFIBinary: BinarySNPOnly}, {EFIBinary: BinaryEFI, HaveARM64: true}, {EFIBinary: BinarySNPOnly, HaveARM64: true}}
	archSets := [][]iana.Arch{nil}
	for a := range iana.Arch(64) {
		archSets = append(archSets, []iana.Arch{a})
	}
	n := 0
	for _, archs := range archSets {
		for _, uc := range userClasses {
			for _, vc := range vendors {
				for _, p := range policies {
					n++
					name := fmt.Sprintf("%v/%v/%q/%+v", archs, uc, vc, p)
					got, err := BootFile(archs, uc, vc, p)
					fw := FirmwareOther
					if len(archs) > 0 {
						if f, ok := family[archs[0]]; ok {
							fw = f
						}
					}
					ipxe := len(uc) > 0 && (uc[0] == "iPXE" || (len(uc) > 1 && uc[1] == "iPXE"))
					pxe := len(vc) >= 9 && vc[:9] == "PXEClient"
					http := len(vc) >= 10 && vc[:10] == "HTTPClient"
					switch {
					case ipxe:
						if err != nil || got.Method != MethodScript || got.Binary != "" || got.Firmware != fw {
							t.Fatalf("%s: iPXE must get the script: %+v %v", name, got, err)
						}
					case !pxe && !http:
						if !errors.Is(err, ErrNotNetboot) {
							t.Fatalf("%s: want ErrNotNetboot, got %+v %v", name, got, err)
						}
					case fw == FirmwareOther, fw == FirmwareBIOS && http, fw == FirmwareEFIarm64 && !p.HaveARM64:
						if !errors.Is(err, ErrUnsupported) {
							t.Fatalf("%s: want ErrUnsupported, got %+v %v", name, got, err)
						}
					default:
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						wantBin := map[Firmware]string{FirmwareBIOS: BinaryBIOS, FirmwareEFIx64: p.EFIBinary, FirmwareEFIarm64: BinaryARM64}[fw]
						wantMethod, wantVC := MethodTFTP, VendorPXEClient
						if http {
							wantMethod, wantVC = MethodHTTP, VendorHTTP
						}
						if got != (BootChoice{fw, wantMethod, wantBin, wantVC}) {
							t.Fatalf("%s: got %+v", name, got)
						}
					}
				}
			}
		}
	}
	t.Logf("%d combinations checked", n)
}

func TestPolicyValidate(t *testing.T) {
	for _, p := range []Policy{{}, {EFIBinary: "snp.efi"}, {EFIBinary: "../ipxe.efi"}} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}
