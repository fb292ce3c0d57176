package vbmc

import (
	"context"
	"fmt"
	"sync"
)

// FakeMachine is an in-memory Machine for tests: safe for concurrent use, it counts every action
// and can be told to fail the next call of a method.
type FakeMachine struct {
	mu       sync.Mutex
	on       bool
	boot     string
	media    string
	calls    map[string]int
	failNext map[string]error
	// ignoreShutdown leaves the machine on after Shutdown (a guest that ignores ACPI).
	ignoreShutdown bool
}

// NewFakeMachine returns a machine that is off and boots from PXE.
func NewFakeMachine() *FakeMachine {
	return &FakeMachine{boot: DevicePXE, calls: map[string]int{}, failNext: map[string]error{}}
}

var _ Machine = (*FakeMachine)(nil)

// FakeState is a snapshot of a FakeMachine.
type FakeState struct {
	On    bool
	Boot  string
	Media string
}

// State returns the machine's current state.
func (f *FakeMachine) State() FakeState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FakeState{On: f.on, Boot: f.boot, Media: f.media}
}

// SetOn forces the power state (test setup).
func (f *FakeMachine) SetOn(on bool) { f.mu.Lock(); f.on = on; f.mu.Unlock() }

// SetIgnoreShutdown makes Shutdown leave the machine on.
func (f *FakeMachine) SetIgnoreShutdown(v bool) { f.mu.Lock(); f.ignoreShutdown = v; f.mu.Unlock() }

// Calls returns how many times method (e.g. "PowerOn") was called.
func (f *FakeMachine) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// AllCalls returns a copy of every method's call count.
func (f *FakeMachine) AllCalls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.calls))
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

// FailNext makes the next call of method return err.
func (f *FakeMachine) FailNext(method string, err error) {
	f.mu.Lock()
	f.failNext[method] = err
	f.mu.Unlock()
}

// enter counts a call and returns the injected error, if any; f.mu must be held.
func (f *FakeMachine) enter(method string) error {
	f.calls[method]++
	if err, ok := f.failNext[method]; ok {
		delete(f.failNext, method)
		return err
	}
	return nil
}

func (f *FakeMachine) PoweredOn(context.Context) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("PoweredOn"); err != nil {
		return false, err
	}
	return f.on, nil
}

func (f *FakeMachine) PowerOn(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("PowerOn"); err != nil {
		return err
	}
	f.on = true
	return nil
}

func (f *FakeMachine) PowerOff(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("PowerOff"); err != nil {
		return err
	}
	f.on = false
	return nil
}

func (f *FakeMachine) Shutdown(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Shutdown"); err != nil {
		return err
	}
	if !f.ignoreShutdown {
		f.on = false
	}
	return nil
}

func (f *FakeMachine) Reset(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enter("Reset")
}

func (f *FakeMachine) SetBootDevice(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("SetBootDevice"); err != nil {
		return err
	}
	switch dev {
	case DevicePXE, DeviceDisk, DeviceCD:
		f.boot = dev
		return nil
	}
	return fmt.Errorf("unknown boot device %q: accepted are pxe, disk, cd", dev)
}

func (f *FakeMachine) BootDevice(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("BootDevice"); err != nil {
		return "", err
	}
	return f.boot, nil
}

func (f *FakeMachine) InsertMedia(_ context.Context, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("InsertMedia"); err != nil {
		return err
	}
	f.media = path
	return nil
}

func (f *FakeMachine) EjectMedia(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("EjectMedia"); err != nil {
		return err
	}
	f.media = ""
	return nil
}
