package qmp

import (
	"context"
	"fmt"
)

// Run states QEMU reports in query-status (a subset: the ones the lab acts on).
const (
	StatusRunning       = "running"
	StatusPaused        = "paused"
	StatusShutdown      = "shutdown"
	StatusPrelaunch     = "prelaunch"
	StatusGuestPanicked = "guest-panicked"
	StatusInternalError = "internal-error"
)

// Status is query-status's answer.
type Status struct {
	Running    bool   `json:"running"`
	Singlestep bool   `json:"singlestep,omitempty"`
	Status     string `json:"status"`
}

// QueryStatus returns the VM's run state.
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := c.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// SystemReset resets the VM (a warm reset; boot order changes apply here).
func (c *Client) SystemReset(ctx context.Context) error {
	return c.Execute(ctx, "system_reset", nil, nil)
}

// SystemPowerdown presses the ACPI power button.
func (c *Client) SystemPowerdown(ctx context.Context) error {
	return c.Execute(ctx, "system_powerdown", nil, nil)
}

// Stop pauses the VM's CPUs.
func (c *Client) Stop(ctx context.Context) error { return c.Execute(ctx, "stop", nil, nil) }

// Cont resumes the VM's CPUs.
func (c *Client) Cont(ctx context.Context) error { return c.Execute(ctx, "cont", nil, nil) }

// Quit ends QEMU. The connection closes right after the reply.
func (c *Client) Quit(ctx context.Context) error { return c.Execute(ctx, "quit", nil, nil) }

// PeripheralPath is the QOM path of the device of id (-device …,id=ID). A device's bare id is
// a partial path, which QEMU resolves only when no other object has that name: an NVMe
// controller's bus is named after the controller, so "disk0" is then "not found".
func PeripheralPath(id string) string { return "/machine/peripheral/" + id }

// QomSet sets property prop of the QOM object at path (PeripheralPath for a device) to value.
func (c *Client) QomSet(ctx context.Context, path, prop string, value any) error {
	args := map[string]any{"path": path, "property": prop, "value": value}
	if err := c.Execute(ctx, "qom-set", args, nil); err != nil {
		return fmt.Errorf("setting %s.%s: %w", path, prop, err)
	}
	return nil
}

// QomGet reads property prop of the QOM object at path into out.
func (c *Client) QomGet(ctx context.Context, path, prop string, out any) error {
	args := map[string]any{"path": path, "property": prop}
	if err := c.Execute(ctx, "qom-get", args, out); err != nil {
		return fmt.Errorf("reading %s.%s: %w", path, prop, err)
	}
	return nil
}

// ChangeMedium loads the image file into the removable drive of device id (e.g. "cd0").
func (c *Client) ChangeMedium(ctx context.Context, id, file string) error {
	args := map[string]any{"id": id, "filename": file, "format": "raw", "read-only-mode": "read-only"}
	if err := c.Execute(ctx, "blockdev-change-medium", args, nil); err != nil {
		return fmt.Errorf("changing medium of %s: %w", id, err)
	}
	return nil
}

// Eject removes the medium of device id, forcing the tray open if the guest locked it.
func (c *Client) Eject(ctx context.Context, id string) error {
	args := map[string]any{"id": id, "force": true}
	if err := c.Execute(ctx, "eject", args, nil); err != nil {
		return fmt.Errorf("ejecting medium of %s: %w", id, err)
	}
	return nil
}
