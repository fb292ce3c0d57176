package site

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
)

// DriverFactory makes a BMC driver for one endpoint. The value implements the bmc capability
// interfaces it supports (bmc.PowerGetter, bmc.BootDeviceSetter, …); one with a
// Close(context.Context) error method is closed after each command.
type DriverFactory func(ctx context.Context, ep bmc.Endpoint) (any, error)

// Driver names the command's "bmc.driver" selects.
const (
	DriverRedfish = "redfish"
	DriverIPMI    = "ipmi"
)

// builtinDrivers is the registry of the drivers the agent ships: one shared IPMI pacer for the
// whole agent (so concurrent commands never storm one BMC), and one memory of the Redfish BMCs
// whose sessions cannot be logged out (so none leaks a session per command).
func builtinDrivers(rf redfish.Options, ip ipmi.Options, pacer *ipmi.Pacer) map[string]DriverFactory {
	ip.Pacer = pacer
	if rf.Sessions == nil {
		rf.Sessions = &redfish.SessionMemory{}
	}
	return map[string]DriverFactory{
		DriverRedfish: func(ctx context.Context, ep bmc.Endpoint) (any, error) { return redfish.New(ctx, ep, rf) },
		DriverIPMI:    func(_ context.Context, ep bmc.Endpoint) (any, error) { return ipmi.New(ep, ip) },
	}
}

// Capabilities, as error messages name them.
const (
	capGetPower = "get power"
	capSetPower = "set power"
	capBoot     = "set boot device"
	capInspect  = "inspect"
	capFirmware = "read firmware versions"
	capRotate   = "rotate credential"
	capMedia    = "use virtual media"
	capBIOS     = "change BIOS settings"
	capConsole  = "open a serial console"
	// capFirmwareUpdate: read the versions and install firmware (both are needed).
	capFirmwareUpdate = "update firmware"
)

// supports reports whether drv implements capability c. Pure.
func supports(drv any, c string) bool {
	switch c {
	case capGetPower:
		_, ok := drv.(bmc.PowerGetter)
		return ok
	case capSetPower:
		_, ok := drv.(bmc.PowerSetter)
		return ok
	case capBoot:
		_, ok := drv.(bmc.BootDeviceSetter)
		return ok
	case capInspect:
		_, ok := drv.(bmc.Inspector)
		return ok
	case capFirmware:
		_, ok := drv.(bmc.FirmwareReader)
		return ok
	case capRotate:
		_, ok := drv.(bmc.CredentialRotator)
		return ok
	case capMedia:
		_, ok := drv.(bmc.VirtualMedia)
		return ok
	case capBIOS:
		_, ok := drv.(bmc.BIOSSetter)
		return ok
	case capConsole:
		_, ok := drv.(bmc.Consoler)
		return ok
	case capFirmwareUpdate:
		_, reads := drv.(bmc.FirmwareReader)
		_, updates := drv.(bmc.FirmwareUpdater)
		return reads && updates
	}
	return false
}

// Attempt is one driver tried for a BMC call and why it failed (nil: it did not).
type Attempt struct {
	Driver  string
	Address string
	Err     error
}

// AttemptsError is what a failed BMC call returns: every driver tried, in order, and its
// reason. It is what an operator reads when a vendor's BMC misbehaves.
type AttemptsError struct {
	What     string // "set power cycle"
	Attempts []Attempt
}

func (e *AttemptsError) Error() string {
	var b strings.Builder
	b.WriteString(e.What)
	b.WriteString(": ")
	for i, a := range e.Attempts {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "driver %s at %s: %v", a.Driver, a.Address, a.Err)
	}
	return b.String()
}

// Unwrap gives errors.Is/As every attempt's error.
func (e *AttemptsError) Unwrap() []error {
	out := make([]error, 0, len(e.Attempts))
	for _, a := range e.Attempts {
		out = append(out, a.Err)
	}
	return out
}

// driverNames lists a registry's names, sorted.
func driverNames(r map[string]DriverFactory) []string {
	return slices.Sorted(maps.Keys(r))
}

// driverOrder is the drivers to try for a command naming `name`: that one only (the node's
// binding says which protocol its BMC speaks and with which credentials). Pure.
func driverOrder(r map[string]DriverFactory, name string) ([]string, error) {
	if _, ok := r[name]; !ok {
		return nil, fmt.Errorf("unknown BMC driver %q: this agent has %s", name, strings.Join(driverNames(r), ", "))
	}
	return []string{name}, nil
}

type closer interface {
	Close(ctx context.Context) error
}

// withDriver runs fn with the first driver of the order that connects and supports the
// capability; every failure is recorded. The password never reaches an error, nor the user
// information, query or fragment of the BMC's address: each error text is checked for them and
// redacted (defence in depth: drivers already keep the password out, and the control plane
// refuses such addresses).
func withDriver(ctx context.Context, reg map[string]DriverFactory, name string, ep bmc.Endpoint, what, capability string,
	fn func(ctx context.Context, drv any) error) error {
	return withDriverCounted(ctx, reg, name, ep, what, capability, nil, fn)
}

// withDriverCounted is withDriver telling m of each driver's call (nil: nobody).
func withDriverCounted(ctx context.Context, reg map[string]DriverFactory, name string, ep bmc.Endpoint, what, capability string,
	m *metrics, fn func(ctx context.Context, drv any) error) error {
	order, err := driverOrder(reg, name)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	fail := &AttemptsError{What: what}
	for _, n := range order {
		start := time.Now()
		stage, err := runDriver(ctx, reg[n], ep, capability, fn)
		m.bmcCall(n, capability, time.Since(start), bmcFailure(stage, err))
		if err == nil {
			return nil
		}
		fail.Attempts = append(fail.Attempts, Attempt{Driver: n, Address: bmc.ShownAddress(ep.Address), Err: redactEndpoint(err, ep)})
		if ctx.Err() != nil {
			break
		}
	}
	return fail
}

// Stages a BMC call fails at (runDriver), and the ends of its context (bmcFailure): the
// reasons failed calls are counted by.
const (
	failConnect     = "connect"
	failUnsupported = "unsupported"
	failCall        = "call"
	failTimeout     = "timeout"
	failCancelled   = "cancelled"
)

// runDriver makes the driver and runs fn with it; a failure says at which stage.
func runDriver(ctx context.Context, f DriverFactory, ep bmc.Endpoint, capability string, fn func(context.Context, any) error) (stage string, _ error) {
	drv, err := f(ctx, ep)
	if err != nil {
		return failConnect, fmt.Errorf("connecting: %w", err)
	}
	if c, ok := drv.(closer); ok {
		defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	}
	if !supports(drv, capability) {
		return failUnsupported, fmt.Errorf("the driver cannot %s", capability)
	}
	return failCall, fn(ctx, drv)
}

// redactedError replaces an error whose text held a secret.
type redactedError struct{ msg string }

func (e redactedError) Error() string { return e.msg }

// redact returns err, or a copy of its text with every secret replaced, when the text holds one.
func redact(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	// The longest first: a secret that holds another (user:password) goes whole.
	secrets = slices.DeleteFunc(slices.Clone(secrets), func(s string) bool { return s == "" })
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	msg := err.Error()
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "[redacted]")
	}
	if msg == err.Error() {
		return err
	}
	return redactedError{msg: msg}
}

// redactEndpoint is redact for a driver's error about ep: the address shown as bmc.ShownAddress
// gives it, then the password and what of the address may be a credential replaced.
func redactEndpoint(err error, ep bmc.Endpoint) error {
	if err == nil {
		return nil
	}
	if shown := bmc.ShownAddress(ep.Address); shown != ep.Address && strings.Contains(err.Error(), ep.Address) {
		err = redactedError{msg: strings.ReplaceAll(err.Error(), ep.Address, shown)}
	}
	return redact(err, append(bmc.AddressSecrets(ep.Address), ep.Password)...)
}
