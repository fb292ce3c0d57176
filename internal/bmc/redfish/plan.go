package redfish

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"bcd/internal/bmc"

	"github.com/stmcginnis/gofish/schemas"
)

// Reset types of DMTF's ComputerSystem.Reset that the driver uses.
const (
	resetOn               = "On"
	resetForceOn          = "ForceOn"
	resetForceOff         = "ForceOff"
	resetGracefulShutdown = "GracefulShutdown"
	resetForceRestart     = "ForceRestart"
	resetGracefulRestart  = "GracefulRestart"
	resetPowerCycle       = "PowerCycle"
)

// defaultResetTypes is assumed when a system advertises no ResetType@Redfish.AllowableValues.
func defaultResetTypes() []string {
	return []string{resetOn, resetForceOff, resetGracefulShutdown, resetForceRestart, resetPowerCycle}
}

// PlanPower decides the ComputerSystem.Reset requests that carry out action on a system in state
// (PowerOn, PowerOff, or PowerUnknown when the BMC reports no usable PowerState) that advertises
// allowed (nil: the DMTF defaults). An empty plan means nothing to do; a step "wait-off" means:
// poll until the system reports Off before the next step.
//
// With an unknown state nothing can be skipped: off sends ForceOff and soft GracefulShutdown (both
// harmless on a machine that is off), on sends On, and cycle and reset take the cycle path
// (PowerCycle, else ForceOff, wait for Off, On), which ends with the machine on either way.
// Transitional states (PoweringOn, PoweringOff) are not planned on: the caller waits for them to
// settle first.
func PlanPower(action bmc.PowerAction, allowed []string, state bmc.PowerState) ([]string, error) {
	if len(allowed) == 0 {
		allowed = defaultResetTypes()
	}
	has := func(t string) bool { return slices.Contains(allowed, t) }
	powerOn := func() ([]string, error) {
		switch {
		case has(resetOn):
			return []string{resetOn}, nil
		case has(resetForceOn):
			return []string{resetForceOn}, nil
		}
		return nil, fmt.Errorf("the BMC advertises no power-on reset type (allowed: %s)", strings.Join(allowed, ", "))
	}
	cyclePath := func() ([]string, error) {
		if has(resetPowerCycle) {
			return []string{resetPowerCycle}, nil
		}
		return offThenOn(allowed)
	}
	on, off := state == bmc.PowerOn, state == bmc.PowerOff
	switch action {
	case bmc.ActionOn:
		if on {
			return nil, nil
		}
		return powerOn()
	case bmc.ActionOff:
		if off {
			return nil, nil
		}
		if !has(resetForceOff) {
			return nil, fmt.Errorf("the BMC does not advertise %s (allowed: %s)", resetForceOff, strings.Join(allowed, ", "))
		}
		return []string{resetForceOff}, nil
	case bmc.ActionSoft:
		if off {
			return nil, nil
		}
		if !has(resetGracefulShutdown) {
			return nil, fmt.Errorf("the BMC does not advertise %s (allowed: %s)", resetGracefulShutdown, strings.Join(allowed, ", "))
		}
		return []string{resetGracefulShutdown}, nil
	case bmc.ActionCycle:
		if off {
			return powerOn()
		}
		return cyclePath()
	case bmc.ActionReset:
		if off {
			return powerOn()
		}
		if !on {
			return cyclePath()
		}
		switch {
		case has(resetForceRestart):
			return []string{resetForceRestart}, nil
		case has(resetPowerCycle):
			return []string{resetPowerCycle}, nil
		}
		return offThenOn(allowed)
	}
	return nil, fmt.Errorf("unknown power action %q", action)
}

// offThenOn is the cycle of a BMC without (a working) PowerCycle: ForceOff, wait for Off, power on.
func offThenOn(allowed []string) ([]string, error) {
	if !slices.Contains(allowed, resetForceOff) {
		return nil, fmt.Errorf("the BMC advertises neither %s nor %s (allowed: %s)", resetPowerCycle, resetForceOff, strings.Join(allowed, ", "))
	}
	switch {
	case slices.Contains(allowed, resetOn):
		return []string{resetForceOff, StepWaitOff, resetOn}, nil
	case slices.Contains(allowed, resetForceOn):
		return []string{resetForceOff, StepWaitOff, resetForceOn}, nil
	}
	return nil, fmt.Errorf("the BMC advertises no power-on reset type (allowed: %s)", strings.Join(allowed, ", "))
}

// StepWaitOff in a power plan waits for the system to report Off.
const StepWaitOff = "wait-off"

// Redfish PowerState values (ComputerSystem.PowerState).
const (
	stateOn          = "On"
	stateOff         = "Off"
	statePoweringOn  = "PoweringOn"
	statePoweringOff = "PoweringOff"
	statePaused      = "Paused"
)

// PowerFromRedfish maps a system's PowerState for reporting: a transition counts as the state it
// heads to. Planning and waiting use the raw state (see planState).
func PowerFromRedfish(s string) bmc.PowerState {
	switch s {
	case stateOn, statePoweringOn, statePaused:
		return bmc.PowerOn
	case stateOff, statePoweringOff:
		return bmc.PowerOff
	}
	return bmc.PowerUnknown
}

// planState maps a settled PowerState for PlanPower: a transition or a missing or unknown value
// is PowerUnknown.
func planState(s string) bmc.PowerState {
	switch s {
	case stateOn, statePaused:
		return bmc.PowerOn
	case stateOff:
		return bmc.PowerOff
	}
	return bmc.PowerUnknown
}

// transitional reports whether s is a power transition, which a plan must wait out.
func transitional(s string) bool { return s == statePoweringOn || s == statePoweringOff }

// notSupportedMessageIDs are the message ids with which a BMC refuses a reset type it listed (or
// that the DMTF defaults assumed): the driver then falls back to ForceOff, wait for Off, On.
func notSupportedMessageIDs() []string {
	return []string{"ActionParameterNotSupported", "ActionParameterValueNotInList", "ActionParameterValueError",
		"PropertyValueNotInList", "ActionNotSupported"}
}

// NotSupported reports whether err is a BMC's refusal of an action or of one of its parameter
// values (HTTP 400, 405 or 501, or a "not supported" message id), as opposed to busy or failed.
func NotSupported(err error) bool {
	var re *schemas.Error
	if !errors.As(err, &re) || Transient(err) {
		return false
	}
	for _, id := range messageIDs(re) {
		if slices.Contains(notSupportedMessageIDs(), id) {
			return true
		}
	}
	switch re.HTTPReturnedStatusCode {
	case http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return true
	}
	return false
}

// bootTarget maps a boot device to BootSourceOverrideTarget.
func bootTarget(d bmc.BootDevice) (string, error) {
	switch d {
	case bmc.BootPXE:
		return "Pxe", nil
	case bmc.BootDisk:
		return "Hdd", nil
	case bmc.BootCD:
		return "Cd", nil
	}
	return "", fmt.Errorf("unknown boot device %q", d)
}

// BootPatch is the Boot object written for a device override.
func BootPatch(d bmc.BootDevice, o bmc.BootOptions) (map[string]string, error) {
	target, err := bootTarget(d)
	if err != nil {
		return nil, err
	}
	p := map[string]string{"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}
	if o.Persistent {
		p["BootSourceOverrideEnabled"] = "Continuous"
	}
	switch o.Mode {
	case bmc.BootModeUEFI:
		p["BootSourceOverrideMode"] = "UEFI"
	case bmc.BootModeLegacy:
		p["BootSourceOverrideMode"] = "Legacy"
	case bmc.BootModeUnchanged:
	default:
		return nil, fmt.Errorf("unknown boot mode %q", o.Mode)
	}
	return p, nil
}

// transientMessageIDs are the message ids (the part after the registry prefix) that mean "busy,
// try again".
func transientMessageIDs() []string {
	return []string{"NodeBusy", "ResourceInUse", "ResetInProgress", "UnableToModifyDuringSystemPOST",
		"ServiceTemporarilyUnavailable"}
}

// Transient reports whether err from a BMC is worth retrying: HTTP 409, 412 (the ETag moved: the
// caller refetches it), 503, or a busy message id.
func Transient(err error) bool {
	var re *schemas.Error
	if !errors.As(err, &re) {
		return false
	}
	switch re.HTTPReturnedStatusCode {
	case http.StatusConflict, http.StatusPreconditionFailed, http.StatusServiceUnavailable:
		return true
	}
	for _, id := range messageIDs(re) {
		if slices.Contains(transientMessageIDs(), id) {
			return true
		}
	}
	return false
}

func lastPart(id string) string {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		return id[i+1:]
	}
	return id
}

func messageIDs(re *schemas.Error) []string {
	var ids []string
	if re.Code != "" {
		ids = append(ids, lastPart(re.Code))
	}
	for _, m := range re.ExtendedInfos {
		if m.MessageID != "" {
			ids = append(ids, lastPart(m.MessageID))
		}
	}
	return ids
}

// BMCMessage is what the BMC said about a failure: its extended messages (with their ids), else
// its error message, else the HTTP status.
func BMCMessage(err error) string {
	var re *schemas.Error
	if !errors.As(err, &re) {
		return err.Error()
	}
	var parts []string
	for _, m := range re.ExtendedInfos {
		if m.Message != "" || m.MessageID != "" {
			parts = append(parts, fmt.Sprintf("%s (%s)", m.Message, m.MessageID))
		}
	}
	if len(parts) == 0 && re.Message != "" {
		parts = append(parts, re.Message)
	}
	msg := clipMessage(strings.Join(parts, "; "))
	if re.HTTPReturnedStatusCode != 0 {
		if msg == "" {
			return fmt.Sprintf("HTTP %d", re.HTTPReturnedStatusCode)
		}
		return fmt.Sprintf("HTTP %d: %s", re.HTTPReturnedStatusCode, msg)
	}
	return msg
}

// maxMessage bounds the BMC's own text in an error: it ends up in events and log lines, and a
// BMC may answer an error with a whole HTML page (gofish then takes the body as the message).
const maxMessage = 512

// clipMessage puts a BMC's message on one line and cuts it at maxMessage bytes (on a rune
// boundary).
func clipMessage(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes)", len(s))
}

// Backoff is the wait before retry attempt n (1 for the first retry): exponential from initial,
// capped at max, with up to ±jitter (0…1) of random spread.
func Backoff(n int, initial, ceiling time.Duration, jitter float64) time.Duration {
	d := initial
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	if jitter > 0 {
		spread := float64(d) * jitter
		d = time.Duration(float64(d) - spread + rand.Float64()*2*spread) //nolint:gosec // jitter, not crypto
	}
	return max(d, 0)
}
