package dhcp

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/insomniacslk/dhcp/iana"
)

// Firmware is the boot environment a client's option 93 names.
type Firmware string

const (
	FirmwareBIOS     Firmware = "bios"      // legacy x86 PXE
	FirmwareEFIx64   Firmware = "efi-x64"   // x86-64 UEFI
	FirmwareEFIarm64 Firmware = "efi-arm64" // AArch64 UEFI
	FirmwareOther    Firmware = "other"     // anything we have no binary for
)

// Method is how the client gets what it boots next.
type Method string

const (
	MethodTFTP   Method = "tftp"   // an iPXE binary by TFTP from next-server
	MethodHTTP   Method = "http"   // an iPXE binary by UEFI HTTP boot (a URL)
	MethodScript Method = "script" // the client is iPXE already: the boot.ipxe URL
)

// Binary names, as Debian's ipxe package ships them in /usr/lib/ipxe (arm64 from a local build).
const (
	BinaryBIOS      = "undionly.kpxe"
	BinaryEFI       = "ipxe.efi"
	BinarySNPOnly   = "snponly.efi"
	BinaryARM64     = "ipxe-arm64.efi"
	VendorPXEClient = "PXEClient"
	VendorHTTP      = "HTTPClient"
	UserClassIPXE   = "iPXE"
)

// Policy is the site's choice where firmware leaves one.
type Policy struct {
	EFIBinary string // BinaryEFI or BinarySNPOnly for x86-64 UEFI
	HaveARM64 bool   // BinaryARM64 exists and may be offered
}

// Validate checks the policy.
func (p Policy) Validate() error {
	if p.EFIBinary != BinaryEFI && p.EFIBinary != BinarySNPOnly {
		return fmt.Errorf("EFI binary %q: accepted are %s, %s", p.EFIBinary, BinaryEFI, BinarySNPOnly)
	}
	return nil
}

// BootChoice is what a network-booting client is told to fetch.
type BootChoice struct {
	Firmware    Firmware
	Method      Method
	Binary      string // for MethodTFTP and MethodHTTP
	VendorClass string // option 60 to echo: PXEClient or HTTPClient ("" for an iPXE that sent neither)
}

var (
	// ErrNotNetboot: the client is not PXE, UEFI HTTP boot or iPXE (a plain DHCP client).
	ErrNotNetboot = errors.New("not a network-boot client")
	// ErrUnsupported: a network-boot client for which the site has no binary.
	ErrUnsupported = errors.New("no boot binary for this client architecture")
)

// firmwareOf maps option 93 to a firmware family; the table is the switch.
func firmwareOf(a iana.Arch) Firmware {
	switch a {
	case iana.INTEL_X86PC:
		return FirmwareBIOS
	case iana.EFI_BC, iana.EFI_X86_64, iana.EFI_X86_64_HTTP: // 7 and 9 are both x86-64 UEFI
		return FirmwareEFIx64
	case iana.EFI_ARM64, iana.EFI_ARM64_HTTP:
		return FirmwareEFIarm64
	}
	return FirmwareOther
}

func vendorKind(vendorClass string) string {
	switch {
	case strings.HasPrefix(vendorClass, VendorPXEClient):
		return VendorPXEClient
	case strings.HasPrefix(vendorClass, VendorHTTP):
		return VendorHTTP
	}
	return ""
}

// BootFile decides what a client boots from its option 93 (archs; the first one counts; none
// means unknown), option 77 (userClasses) and option 60 (vendorClass). Pure; the test walks
// every architecture code against every class combination.
//
//   - user class "iPXE" → the boot.ipxe script, whatever the architecture;
//   - vendor class neither PXEClient nor HTTPClient → ErrNotNetboot;
//   - BIOS → undionly.kpxe by TFTP (no HTTP boot for BIOS);
//   - x86-64 UEFI → the policy's EFI binary, by TFTP or (HTTPClient) by HTTP;
//   - arm64 UEFI → ipxe-arm64.efi only when the policy says it exists;
//   - anything else → ErrUnsupported.
func BootFile(archs []iana.Arch, userClasses []string, vendorClass string, p Policy) (BootChoice, error) {
	fw := FirmwareOther
	if len(archs) > 0 {
		fw = firmwareOf(archs[0])
	}
	vk := vendorKind(vendorClass)
	if slices.Contains(userClasses, UserClassIPXE) {
		return BootChoice{Firmware: fw, Method: MethodScript, VendorClass: vk}, nil
	}
	if vk == "" {
		return BootChoice{}, ErrNotNetboot
	}
	if err := p.Validate(); err != nil {
		return BootChoice{}, err
	}
	method := MethodTFTP
	if vk == VendorHTTP {
		method = MethodHTTP
	}
	var bin string
	switch fw {
	case FirmwareBIOS:
		if method == MethodHTTP {
			return BootChoice{}, fmt.Errorf("%w: HTTP boot from BIOS", ErrUnsupported)
		}
		bin = BinaryBIOS
	case FirmwareEFIx64:
		bin = p.EFIBinary
	case FirmwareEFIarm64:
		if !p.HaveARM64 {
			return BootChoice{}, fmt.Errorf("%w: %s is not installed", ErrUnsupported, BinaryARM64)
		}
		bin = BinaryARM64
	default:
		if len(archs) == 0 {
			return BootChoice{}, fmt.Errorf("%w: client sent no architecture (option 93)", ErrUnsupported)
		}
		return BootChoice{}, fmt.Errorf("%w: architecture %d", ErrUnsupported, uint16(archs[0]))
	}
	return BootChoice{Firmware: fw, Method: method, Binary: bin, VendorClass: vk}, nil
}
