package redfish

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

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

// PlanPower decides the ComputerSystem.Reset requests that carry out action on a system that is
// on (or not) and advertises allowed (nil: the DMTF defaults). An empty plan means nothing to do;
// a step "wait-off" means: poll until the system reports Off before the next step.
func PlanPower(action bmc.PowerAction, allowed []string, on bool) ([]string, error) {
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
	offThenOn := func() ([]string, error) {
		if !has(resetForceOff) {
			return nil, fmt.Errorf("the BMC advertises neither %s nor %s (allowed: %s)", resetPowerCycle, resetForceOff, strings.Join(allowed, ", "))
		}
		rest, err := powerOn()
		if err != nil {
			return nil, err
		}
		return append([]string{resetForceOff, StepWaitOff}, rest...), nil
	}
	switch action {
	case bmc.ActionOn:
		if on {
			return nil, nil
		}
		return powerOn()
	case bmc.ActionOff:
		if !on {
			return nil, nil
		}
		if !has(resetForceOff) {
			return nil, fmt.Errorf("the BMC does not advertise %s (allowed: %s)", resetForceOff, strings.Join(allowed, ", "))
		}
		return []string{resetForceOff}, nil
	case bmc.ActionSoft:
		if !on {
			return nil, nil
		}
		if !has(resetGracefulShutdown) {
			return nil, fmt.Errorf("the BMC does not advertise %s (allowed: %s)", resetGracefulShutdown, strings.Join(allowed, ", "))
		}
		return []string{resetGracefulShutdown}, nil
	case bmc.ActionCycle:
		if !on {
			return powerOn()
		}
		if has(resetPowerCycle) {
			return []string{resetPowerCycle}, nil
		}
		return offThenOn()
	case bmc.ActionReset:
		if !on {
			return powerOn()
		}
		switch {
		case has(resetForceRestart):
			return []string{resetForceRestart}, nil
		case has(resetPowerCycle):
			return []string{resetPowerCycle}, nil
		}
		return offThenOn()
	}
	return nil, fmt.Errorf("unknown power action %q", action)
}

// StepWaitOff in a power plan waits for the system to report Off.
const StepWaitOff = "wait-off"

// PowerFromRedfish maps a system's PowerState.
func PowerFromRedfish(s string) bmc.PowerState {
	switch s {
	case "On", "PoweringOn", "Paused":
		return bmc.PowerOn
	case "Off", "PoweringOff":
		return bmc.PowerOff
	}
	return bmc.PowerUnknown
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
	msg := strings.Join(parts, "; ")
	if re.HTTPReturnedStatusCode != 0 {
		if msg == "" {
			return fmt.Sprintf("HTTP %d", re.HTTPReturnedStatusCode)
		}
		return fmt.Sprintf("HTTP %d: %s", re.HTTPReturnedStatusCode, msg)
	}
	return msg
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
