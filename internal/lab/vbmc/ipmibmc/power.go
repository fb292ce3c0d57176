package ipmibmc

import (
	"context"
	"fmt"

	"github.com/bougou/go-ipmi/pkg/hal"
	"github.com/bougou/go-ipmi/pkg/types"
)

// powerAction is one queued chassis control.
type powerAction string

const (
	actOn    powerAction = "on"
	actOff   powerAction = "off"
	actCycle powerAction = "cycle"
	actReset powerAction = "reset"
	actSoft  powerAction = "soft"
)

// machineStep is what the worker does to the machine for an action given its power state.
type machineStep string

const (
	stepNone     machineStep = "none"     // already in the requested state
	stepOn       machineStep = "on"       // PowerOn
	stepOff      machineStep = "off"      // PowerOff
	stepShutdown machineStep = "shutdown" // ACPI button
	stepReset    machineStep = "reset"    // warm reset
	stepOffOn    machineStep = "off-on"   // PowerOff then PowerOn
)

// planAction decides what to do with the machine. A cycle or reset of a machine that is off
// powers it on (what most BMCs do, and what a caller who asked for a reboot wants).
// The result's second value says whether the machine boots (which consumes one-time boot flags).
func planAction(a powerAction, on bool) (machineStep, bool) {
	switch a {
	case actOn:
		if on {
			return stepNone, false
		}
		return stepOn, true
	case actOff:
		if !on {
			return stepNone, false
		}
		return stepOff, false
	case actSoft:
		if !on {
			return stepNone, false
		}
		return stepShutdown, false
	case actReset:
		if !on {
			return stepOn, true
		}
		return stepReset, true
	case actCycle:
		if !on {
			return stepOn, true
		}
		return stepOffOn, true
	}
	return stepNone, false
}

// enqueue hands an action to the worker without waiting: the Chassis Control answers at once.
func (b *BMC) enqueue(a powerAction) error {
	select {
	case b.actions <- a:
		b.queued.Add(1)
		b.log.Info("power action queued", "action", a)
		return nil
	default:
		b.log.Warn("power action refused: queue full", "action", a)
		return types.CodeNodeBusy
	}
}

// runActions is the one goroutine that touches the machine's power, in arrival order.
func (b *BMC) runActions(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-b.actions:
			if err := b.runAction(ctx, a); err != nil {
				b.log.Error("power action failed", "action", a, "err", err)
			}
			b.done.Add(1)
		}
	}
}

func (b *BMC) runAction(ctx context.Context, a powerAction) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ActionTimeout)
	defer cancel()
	on, err := b.m.PoweredOn(ctx)
	if err != nil {
		return fmt.Errorf("reading power state before %s: %w", a, err)
	}
	step, boots := planAction(a, on)
	switch step {
	case stepNone:
		b.log.Info("power action: nothing to do", "action", a, "on", on)
		return nil
	case stepOn:
		err = b.m.PowerOn(ctx)
	case stepOff:
		err = b.m.PowerOff(ctx)
	case stepShutdown:
		err = b.m.Shutdown(ctx)
	case stepReset:
		err = b.m.Reset(ctx)
	case stepOffOn:
		if err = b.m.PowerOff(ctx); err == nil {
			err = b.m.PowerOn(ctx)
		}
	}
	if err != nil {
		return fmt.Errorf("running %s (%s): %w", a, step, err)
	}
	if boots {
		b.boot.consumeOneTime()
	}
	b.log.Info("power action done", "action", a, "step", step)
	return nil
}

// machineHAL is the go-ipmi HAL: the chassis, and the serial console when Config has one.
type machineHAL struct{ b *BMC }

func (h machineHAL) Chassis() hal.ChassisHAL { return chassisHAL(h) }
func (machineHAL) Sensors() hal.SensorHAL    { return nil }
func (machineHAL) Storage() hal.StorageHAL   { return nil }
func (h machineHAL) Network() hal.NetworkHAL { return networkHAL(h) }
func (machineHAL) GPIO() hal.GPIOHAL         { return nil }
func (machineHAL) I2C() hal.I2CHAL           { return nil }
func (h machineHAL) Console() hal.ConsoleHAL {
	if h.b.serial == nil {
		return nil // SOL not offered
	}
	return consoleHAL(h)
}
func (machineHAL) Close() error { return nil }

// chassisHAL maps go-ipmi's chassis calls onto the action queue. go-ipmi's Chassis Control
// handler routes: power down → SetPower(false), power up → SetPower(true), cycle → PowerCycle,
// hard reset → ColdReset, soft shutdown → WarmReset.
type chassisHAL struct{ b *BMC }

func (c chassisHAL) PowerState(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, machineCallTimeout)
	defer cancel()
	on, err := c.b.m.PoweredOn(ctx)
	if err != nil {
		c.b.log.Error("reading power state", "err", err)
		return false, fmt.Errorf("reading power state: %w", err)
	}
	return on, nil
}

func (c chassisHAL) SetPower(_ context.Context, on bool) error {
	if on {
		return c.b.enqueue(actOn)
	}
	return c.b.enqueue(actOff)
}
func (c chassisHAL) PowerCycle(context.Context) error           { return c.b.enqueue(actCycle) }
func (c chassisHAL) ColdReset(context.Context) error            { return c.b.enqueue(actReset) }
func (c chassisHAL) WarmReset(context.Context) error            { return c.b.enqueue(actSoft) }
func (chassisHAL) Identify(context.Context, uint8) error        { return nil }
func (chassisHAL) IntrusionState(context.Context) (bool, error) { return false, hal.ErrNotSupported }

// The boot calls are answered by our own Set/Get System Boot Options handlers; these exist for
// the interface and share the same store.
func (c chassisHAL) SetBootFlags(ctx context.Context, f *types.BootOptionParam_BootFlags) error {
	w, err := parseSetBootOptions(append([]byte{paramBootFlags}, f.Pack()...))
	if err != nil {
		return err
	}
	if cc := c.b.applyBootWrite(ctx, w); cc != types.CodeOK {
		return cc
	}
	return nil
}

func (c chassisHAL) GetBootFlags(context.Context) (*types.BootOptionParam_BootFlags, error) {
	raw := c.b.boot.get().flags.raw
	var f types.BootOptionParam_BootFlags
	if err := f.Unpack(raw[:]); err != nil {
		return nil, err
	}
	return &f, nil
}

func (chassisHAL) SetBootInfoAcknowledge(context.Context, *types.BootOptionParam_BootInfoAcknowledge) error {
	return nil
}

func (chassisHAL) GetBootInfoAcknowledge(context.Context) (*types.BootOptionParam_BootInfoAcknowledge, error) {
	return &types.BootOptionParam_BootInfoAcknowledge{}, nil
}

// networkHAL reports the RMCP+ socket's address as the BMC's LAN configuration (in-band
// software reads where to reach the BMC out of band); it cannot be changed.
type networkHAL struct{ b *BMC }

func (n networkHAL) GetConfig(context.Context) (*hal.IPConfig, error) {
	a := n.b.Addr()
	ip := a.IP.To4()
	if ip == nil {
		return nil, hal.ErrNotSupported
	}
	cfg := &hal.IPConfig{Port: uint16(a.Port), Mask: [4]byte{255, 255, 255, 0}}
	copy(cfg.IP[:], ip)
	return cfg, nil
}

func (networkHAL) SetConfig(context.Context, *hal.IPConfig) error { return hal.ErrNotSupported }
