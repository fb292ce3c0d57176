package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/ramdisk/inventory"
)

// fakePowerOff records the power-off the ramdisk asked for (the reboot syscall on a machine).
type fakePowerOff struct {
	called chan struct{}
	err    error
}

func (f *fakePowerOff) PowerOff(context.Context) error {
	f.called <- struct{}{}
	return f.err
}

func waitPowerOff(t *testing.T, f *fakePowerOff) {
	t.Helper()
	select {
	case <-f.called:
	case <-time.After(10 * time.Second):
		t.Fatal("the host was not powered off")
	}
}

// TestPowerOffAfterTheResult: ramdisk.powerOff returns its result first, then powers the host
// off; no command starts after it.
func TestPowerOffAfterTheResult(t *testing.T) {
	f := &fakePowerOff{called: make(chan struct{}, 1)}
	d := testDeps(t, inventory.Inventory{})
	d.PowerOff, d.PowerOffDelay = f, 50*time.Millisecond
	c := NewCommands(d)
	res, err, _ := run(t, c, KindPowerOff, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var got PowerOffResult
	if err := json.Unmarshal(res, &got); err != nil || !got.PoweringOff || got.In != "50ms" {
		t.Fatalf("result %s (%v), want poweringOff in 50ms", res, err)
	}
	select {
	case <-f.called:
		t.Fatal("powered off before the delay for the result to reach the gateway")
	default:
	}
	if _, err, _ := run(t, c, KindInventory, `{}`); err == nil || !strings.Contains(err.Error(), "powering its host off") {
		t.Errorf("a command after the power-off: err = %v, want a refusal", err)
	}
	waitPowerOff(t, f)
}

// TestPowerOffRefusedWhileBusy: a ramdisk running another command (a workflow took it) does
// not power off.
func TestPowerOffRefusedWhileBusy(t *testing.T) {
	f := &fakePowerOff{called: make(chan struct{}, 1)}
	d := testDeps(t, inventory.Inventory{})
	d.PowerOff, d.PowerOffDelay = f, time.Millisecond
	c := NewCommands(d)
	started, release := make(chan struct{}), make(chan struct{})
	c.table["test.block"] = func(ctx context.Context, _ []byte, _ func(agentlink.Progress)) ([]byte, error) {
		close(started)
		<-release
		return []byte(`{}`), nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(context.Background(), agentlink.Command{ID: "b", Kind: "test.block"}, func(agentlink.Progress) {})
		done <- err
	}()
	<-started
	_, err, _ := run(t, c, KindPowerOff, `{}`)
	close(release)
	if err == nil || !strings.Contains(err.Error(), "1 other command(s) running") {
		t.Fatalf("power-off while busy: err = %v, want a refusal", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.called:
		t.Fatal("powered off while a command ran")
	default:
	}
	// Idle again: accepted.
	if _, err, _ := run(t, c, KindPowerOff, `{}`); err != nil {
		t.Fatal(err)
	}
	waitPowerOff(t, f)
}

// TestPowerOffFailureKeepsTheRamdisk: when the syscall fails the ramdisk stays usable.
func TestPowerOffFailureKeepsTheRamdisk(t *testing.T) {
	f := &fakePowerOff{called: make(chan struct{}, 1), err: errors.New("EPERM")}
	d := testDeps(t, inventory.Inventory{})
	d.PowerOff, d.PowerOffDelay = f, time.Millisecond
	c := NewCommands(d)
	if _, err, _ := run(t, c, KindPowerOff, `{}`); err != nil {
		t.Fatal(err)
	}
	waitPowerOff(t, f)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err, _ := run(t, c, KindInventory, `{}`)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ramdisk stayed closed after a failed power-off: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.PowerOff = nil
	if _, err, _ := run(t, NewCommands(d), KindPowerOff, `{}`); err == nil || !strings.Contains(err.Error(), "cannot power its host off") {
		t.Errorf("no power-off configured: err = %v", err)
	}
}
