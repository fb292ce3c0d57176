package ipmi

import (
	"context"
	"fmt"
	"time"

	"github.com/bougou/go-ipmi/pkg/command/chassis"

	"bcd/internal/bmc"
)

// powerStep is what SetPower sends for an action, given the power state it read first.
type powerStep struct {
	Send    bool                   // false: already there, nothing sent
	Control chassis.ChassisControl // Chassis Control action
	Await   bmc.PowerState         // state to wait for after sending; "" for none
}

// planPower decides the command for (action, current state). On and off are idempotent from our
// side; cycle and reset of a machine that is off power it on (the caller wants it running the
// next boot device, and many BMCs refuse a cycle of an off chassis); soft of an off machine is
// a no-op. Soft shutdown is not awaited: it depends on the OS.
func planPower(a bmc.PowerAction, on bool) (powerStep, error) {
	powerUp := powerStep{Send: true, Control: chassis.ChassisControlPowerUp, Await: bmc.PowerOn}
	switch a {
	case bmc.ActionOn:
		if on {
			return powerStep{}, nil
		}
		return powerUp, nil
	case bmc.ActionOff:
		if !on {
			return powerStep{}, nil
		}
		return powerStep{Send: true, Control: chassis.ChassisControlPowerDown, Await: bmc.PowerOff}, nil
	case bmc.ActionSoft:
		if !on {
			return powerStep{}, nil
		}
		return powerStep{Send: true, Control: chassis.ChassisControlSoftShutdown}, nil
	case bmc.ActionCycle:
		if !on {
			return powerUp, nil
		}
		return powerStep{Send: true, Control: chassis.ChassisControlPowerCycle}, nil
	case bmc.ActionReset:
		if !on {
			return powerUp, nil
		}
		return powerStep{Send: true, Control: chassis.ChassisControlHardReset}, nil
	}
	_, err := bmc.ParsePowerAction(string(a))
	return powerStep{}, err
}

var controlNames = map[chassis.ChassisControl]string{
	chassis.ChassisControlPowerDown:    "power down",
	chassis.ChassisControlPowerUp:      "power up",
	chassis.ChassisControlPowerCycle:   "power cycle",
	chassis.ChassisControlHardReset:    "hard reset",
	chassis.ChassisControlSoftShutdown: "soft shutdown",
}

// GetPower reads the chassis power state.
func (d *Driver) GetPower(ctx context.Context) (bmc.PowerState, error) {
	state := bmc.PowerUnknown
	err := d.withSession(ctx, "getting power state", func(ctx context.Context, s *session) error {
		on, err := s.poweredOn(ctx)
		if err != nil {
			return err
		}
		state = stateOf(on)
		return nil
	})
	return state, err
}

// SetPower reads the power state, sends what planPower decides and, for on and off, waits until
// the BMC reports the new state.
func (d *Driver) SetPower(ctx context.Context, action bmc.PowerAction) error {
	if _, err := bmc.ParsePowerAction(string(action)); err != nil {
		return fmt.Errorf("setting power on %s: %w", d.addr, err)
	}
	open := d.withSession
	if action == bmc.ActionCycle || action == bmc.ActionReset {
		open = d.withSessionOnce // a cycle or reset must never reach the BMC twice
	}
	return open(ctx, fmt.Sprintf("setting power %s", action), func(ctx context.Context, s *session) error {
		on, err := s.poweredOn(ctx)
		if err != nil {
			return err
		}
		step, err := planPower(action, on)
		if err != nil {
			return err
		}
		if !step.Send {
			d.log.Info("power already in the requested state; nothing sent", "action", action, "power", stateOf(on))
			return nil
		}
		name := controlNames[step.Control]
		err = s.do(ctx, "Chassis Control "+name, func(ctx context.Context) error {
			_, err := s.c.ChassisControl(ctx, step.Control)
			return err
		})
		if err != nil && s.once && !answered(err) {
			return fmt.Errorf("%w: no answer from the BMC, which may or may not have run the %s; it is not sent again (it would run twice): read the power state before retrying",
				err, name)
		}
		if err != nil {
			return err
		}
		d.log.Info("chassis control sent", "action", action, "control", name)
		if step.Await == "" {
			return nil
		}
		return s.awaitPower(ctx, step.Await, name)
	})
}

// awaitPower polls the power state until it is want or SettleTimeout passes.
func (s *session) awaitPower(ctx context.Context, want bmc.PowerState, sent string) error {
	deadline := time.Now().Add(s.d.opts.SettleTimeout)
	for {
		on, err := s.poweredOn(ctx)
		if err != nil {
			return fmt.Errorf("waiting for power %s after %s: %w", want, sent, err)
		}
		if stateOf(on) == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the BMC accepted %s but still reports power %s after %s", sent, stateOf(on), s.d.opts.SettleTimeout)
		}
		t := time.NewTimer(s.d.opts.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for power %s after %s: %w", want, sent, ctx.Err())
		case <-t.C:
		}
	}
}
