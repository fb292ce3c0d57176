// Package bmc holds the vocabulary shared by every BMC driver (Redfish, IPMI, …) and the small,
// per-capability interfaces that callers declare they need. Drivers live in sub-packages.
package bmc

import (
	"context"
	"fmt"
	"log/slog"
)

// PowerState is a machine's power as its BMC reports it.
type PowerState string

const (
	PowerOn      PowerState = "on"
	PowerOff     PowerState = "off"
	PowerUnknown PowerState = "unknown"
)

// PowerAction is what an operator or a workflow asks a BMC to do with a machine's power.
type PowerAction string

const (
	ActionOn    PowerAction = "on"    // power on; no-op when already on
	ActionOff   PowerAction = "off"   // hard power off
	ActionSoft  PowerAction = "soft"  // graceful shutdown through the OS (ACPI)
	ActionCycle PowerAction = "cycle" // off then on
	ActionReset PowerAction = "reset" // warm reset
)

// PowerActions lists every accepted action, in the order error messages name them.
var PowerActions = []PowerAction{ActionOn, ActionOff, ActionSoft, ActionCycle, ActionReset}

// ParsePowerAction validates s.
func ParsePowerAction(s string) (PowerAction, error) {
	for _, a := range PowerActions {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown power action %q: accepted are on, off, soft, cycle, reset", s)
}

// BootDevice is the device a machine boots from next.
type BootDevice string

const (
	BootPXE  BootDevice = "pxe"
	BootDisk BootDevice = "disk"
	BootCD   BootDevice = "cd"
)

// ParseBootDevice validates s.
func ParseBootDevice(s string) (BootDevice, error) {
	switch BootDevice(s) {
	case BootPXE, BootDisk, BootCD:
		return BootDevice(s), nil
	}
	return "", fmt.Errorf("unknown boot device %q: accepted are pxe, disk, cd", s)
}

// BootMode is the firmware mode a boot override asks for; empty means "leave as is".
type BootMode string

const (
	BootModeUnchanged BootMode = ""
	BootModeUEFI      BootMode = "uefi"
	BootModeLegacy    BootMode = "legacy"
)

// ParseBootMode validates a node's boot mode: uefi, legacy, or empty for the driver's behaviour
// (Redfish leaves the mode as it is; IPMI keeps a valid override's mode, else writes UEFI).
func ParseBootMode(s string) (BootMode, error) {
	switch BootMode(s) {
	case BootModeUnchanged, BootModeUEFI, BootModeLegacy:
		return BootMode(s), nil
	}
	return "", fmt.Errorf("unknown boot mode %q: accepted are uefi, legacy, or empty for the driver's behaviour", s)
}

// CommandBootMode is the mode a bmc.boot command carries: the step's own mode argument when it
// gives one (an explicit argument wins), else the node's boot mode; empty leaves the driver's
// behaviour. Pure.
func CommandBootMode(stepMode string, node BootMode) BootMode {
	if stepMode != "" {
		return BootMode(stepMode)
	}
	return node
}

// BootOptions qualify a boot device override.
type BootOptions struct {
	Persistent bool     // every boot rather than the next one only
	Mode       BootMode // UEFI or legacy BIOS
}

// Endpoint is how a driver reaches one BMC. Password is the plain secret, held only in memory
// by the site agent for the duration of a call: never log, print or wrap it into an error.
type Endpoint struct {
	Address  string // host[:port] or URL (Redfish)
	Username string
	Password string
	// TLS (Redfish): Insecure skips verification and is used only when asked for; otherwise CAPEM
	// (a PEM bundle) or FingerprintSHA256 (hex of the leaf certificate's DER) pins the BMC.
	Insecure          bool
	CAPEM             []byte
	FingerprintSHA256 string
}

// String never shows the password, nor what of the address may be a credential (ShownAddress).
func (e Endpoint) String() string { return fmt.Sprintf("%s@%s", e.Username, ShownAddress(e.Address)) }

// GoString keeps %#v (of the endpoint, or of anything holding it) from printing the password.
func (e Endpoint) GoString() string { return "bmc.Endpoint(" + e.String() + ")" }

// LogValue never shows the password either (slog's JSON handler would otherwise print every
// field).
func (e Endpoint) LogValue() slog.Value {
	return slog.GroupValue(slog.String("address", ShownAddress(e.Address)), slog.String("username", e.Username), slog.Bool("insecure", e.Insecure),
		slog.String("fingerprint_sha256", e.FingerprintSHA256))
}

// OOBInventory is what a BMC tells about its machine without booting it.
type OOBInventory struct {
	SystemUUID   string     `json:"systemUuid,omitempty"`
	SerialNumber string     `json:"serialNumber,omitempty"`
	Manufacturer string     `json:"manufacturer,omitempty"`
	Model        string     `json:"model,omitempty"`
	MACs         []string   `json:"macs,omitempty"` // lower-case, colon separated
	Power        PowerState `json:"power,omitempty"`
}

// The capabilities. Callers declare the one they need; a driver implements those it can.

type PowerGetter interface {
	GetPower(ctx context.Context) (PowerState, error)
}

type PowerSetter interface {
	SetPower(ctx context.Context, action PowerAction) error
}

// Power is the power driver concern (DESIGN §5): getPower, setPower.
type Power interface {
	PowerGetter
	PowerSetter
}

// BootDeviceSetter is the management concern: set the next (or every) boot device, then read it
// back; a BMC that accepted the write but did not apply it is an error.
type BootDeviceSetter interface {
	SetBootDevice(ctx context.Context, dev BootDevice, opts BootOptions) error
}

// Inspector reads the out-of-band inventory.
type Inspector interface {
	Inspect(ctx context.Context) (OOBInventory, error)
}

// VirtualMedia inserts and ejects an ISO by URL.
type VirtualMedia interface {
	InsertMedia(ctx context.Context, imageURL string) error
	EjectMedia(ctx context.Context) error
}

// CredentialRotator changes the password of the account the driver logs in with.
type CredentialRotator interface {
	RotateCredential(ctx context.Context, newPassword string) error
}
