// Package redfishbmc is the lab's virtual Redfish BMC: an http.Handler that serves a Redfish
// service (modelled on DMTF's public mockups) over a vbmc.Machine. Layouts and vendor quirks are
// options, so a Redfish client's tests can meet the behaviour of real BMCs.
package redfishbmc

import (
	"log/slog"
	"net/http"
)

// Layout is where a client writes boot overrides.
type Layout string

const (
	// LayoutPlain applies a PATCH of the ComputerSystem at once (DMTF mockup style).
	LayoutPlain Layout = "plain"
	// LayoutSettings advertises @Redfish.Settings: boot overrides go to the SettingsObject (the
	// future state, applied at the next reset) and need If-Match.
	LayoutSettings Layout = "settings"
)

// Request kinds, as counted by Service.Count and named by Busy.
const (
	KindRead    = "read"    // any GET
	KindReset   = "reset"   // ComputerSystem.Reset
	KindBoot    = "boot"    // PATCH of the system or its settings
	KindBIOS    = "bios"    // PATCH of the Bios resource or its settings object
	KindMedia   = "media"   // InsertMedia / EjectMedia
	KindAccount = "account" // PATCH of an account
	KindSession = "session" // POST / DELETE of a session
	KindUpdate  = "update"  // UpdateService.SimpleUpdate
	KindOther   = "other"
)

// Busy makes the service refuse the first Count requests of Kind with Status (503 or 409) and an
// error whose @Message.ExtendedInfo carries MessageID (e.g. "Base.1.15.NodeBusy").
type Busy struct {
	Kind      string
	Count     int
	Status    int
	MessageID string
}

// Quirks reproduce vendor behaviour.
type Quirks struct {
	// IgnoreBootOverride answers a boot-override write with success and changes nothing.
	IgnoreBootOverride bool
	// ResetTypes is the advertised ResetType subset; nil advertises every supported type.
	ResetTypes []string
	// Busy refuses the first requests of some kinds.
	Busy []Busy
	// NoSessions answers session creation with 405: clients must fall back to basic auth.
	NoSessions bool
	// NoUpdateService leaves the UpdateService out of the service root (older BMCs).
	NoUpdateService bool
	// NoBIOS leaves the Bios link out of the system and serves no Bios resource (BMCs that
	// expose no BIOS attributes through Redfish).
	NoBIOS bool
	// IgnoreBIOSSettings accepts BIOS settings (the settings object shows them pending) and
	// drops them at the next reset without applying them: the silent vendor failure that only a
	// read-back after the reset catches.
	IgnoreBIOSSettings bool
	// NoSimpleUpdate serves the UpdateService without Actions (no SimpleUpdate): BMCs that
	// take firmware only by push, or not at all, through Redfish.
	NoSimpleUpdate bool
	// FirmwareUpdateFails accepts a SimpleUpdate (202 and a task) whose task then ends in
	// Exception with a message, nothing staged.
	FirmwareUpdateFails bool
}

// FirmwareComponent is a FirmwareInventory member.
type FirmwareComponent struct{ ID, Name, Version string }

// Config describes the virtual BMC and its machine.
type Config struct {
	Layout   Layout
	Quirks   Quirks
	Username string
	Password string // the only account's password; never logged

	UUID         string
	SerialNumber string
	Manufacturer string
	Model        string
	MACs         []string
	// BiosVersion is the system's BiosVersion; Firmware the UpdateService's FirmwareInventory
	// (its members in order). The manager's FirmwareVersion is "bcd-vbmc-1".
	//
	// UpdateService.SimpleUpdate fetches its ImageURI (http or https, with Fetch) and installs
	// a lab firmware image (FirmwareImage) on the component it names: an inventory id, or BIOS
	// (the BiosVersion) or BMC (the manager's FirmwareVersion). The task shows Running for
	// UpdatePolls reads (0: one), then Completed. BMC's new version runs when the task
	// completes; any other's at the next reset that boots the host.
	BiosVersion string
	Firmware    []FirmwareComponent
	UpdatePolls int
	// BIOSAttributes are the Bios resource's current Attributes: each a string, a boolean, an
	// integer (any Go integer type, or a float64 or json.Number holding one) or nil (a
	// write-only attribute, such as a password, which reads as null). Nil: DefaultBIOSAttributes.
	// Settings PATCHed to Bios/Settings (If-Match required in LayoutSettings) are applied at the
	// next reset that boots the host (On from off, ForceRestart, PowerCycle).
	BIOSAttributes map[string]any

	// MediaDir receives images fetched for virtual media; AllowFileImages also accepts file://
	// URLs naming a local ISO (the lab only). Fetch fetches http(s) images, virtual media and
	// firmware (nil: a default client).
	MediaDir        string
	AllowFileImages bool
	Fetch           *http.Client

	Log *slog.Logger
}

// DefaultBIOSAttributes is a small, realistic set of BIOS attributes (Dell-like names): strings,
// an integer, a boolean and a write-only password (null).
func DefaultBIOSAttributes() map[string]any {
	return map[string]any{
		"BootMode":           "Uefi",
		"ProcVirtualization": "Enabled",
		"SriovGlobalEnable":  "Disabled",
		"ProcCStates":        "Enabled",
		"ProcCoreDisable":    0,
		"EmbNicPxe":          true,
		"SetupPassword":      nil,
	}
}

// AllResetTypes lists every ResetType the service can carry out, in advertised order.
func AllResetTypes() []string {
	return []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"}
}
