package vbmc_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"bcd/internal/lab/vbmc"
)

func TestFakeMachine(t *testing.T) {
	ctx := context.Background()
	f := vbmc.NewFakeMachine()
	if st := f.State(); st.On || st.Boot != "pxe" || st.Media != "" {
		t.Fatalf("initial state %+v", st)
	}
	steps := []struct {
		name string
		do   func() error
		want vbmc.FakeState
	}{
		{"PowerOn", func() error { return f.PowerOn(ctx) }, vbmc.FakeState{On: true, Boot: "pxe"}},
		{"SetBootDevice", func() error { return f.SetBootDevice(ctx, "disk") }, vbmc.FakeState{On: true, Boot: "disk"}},
		{"InsertMedia", func() error { return f.InsertMedia(ctx, "/a.iso") }, vbmc.FakeState{On: true, Boot: "disk", Media: "/a.iso"}},
		{"Reset", func() error { return f.Reset(ctx) }, vbmc.FakeState{On: true, Boot: "disk", Media: "/a.iso"}},
		{"Shutdown", func() error { return f.Shutdown(ctx) }, vbmc.FakeState{Boot: "disk", Media: "/a.iso"}},
		{"EjectMedia", func() error { return f.EjectMedia(ctx) }, vbmc.FakeState{Boot: "disk"}},
		{"PowerOn", func() error { return f.PowerOn(ctx) }, vbmc.FakeState{On: true, Boot: "disk"}},
		{"PowerOff", func() error { return f.PowerOff(ctx) }, vbmc.FakeState{Boot: "disk"}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := f.State(); got != s.want {
			t.Fatalf("after %s: %+v, want %+v", s.name, got, s.want)
		}
	}
	if f.Calls("PowerOn") != 2 || f.Calls("PowerOff") != 1 || f.AllCalls()["Reset"] != 1 {
		t.Fatalf("counters %v", f.AllCalls())
	}
	if err := f.SetBootDevice(ctx, "floppy"); err == nil {
		t.Fatal("unknown device accepted")
	}
	boom := errors.New("boom")
	f.FailNext("PowerOn", boom)
	if err := f.PowerOn(ctx); !errors.Is(err, boom) {
		t.Fatalf("injected error: %v", err)
	}
	if err := f.PowerOn(ctx); err != nil {
		t.Fatalf("error injected twice: %v", err)
	}
	f.SetIgnoreShutdown(true)
	_ = f.Shutdown(ctx)
	if on, _ := f.PoweredOn(ctx); !on {
		t.Fatal("ignored shutdown powered off")
	}
}

func TestFakeMachineConcurrent(t *testing.T) {
	ctx := context.Background()
	f := vbmc.NewFakeMachine()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			_ = f.PowerOn(ctx)
			_, _ = f.PoweredOn(ctx)
			_ = f.SetBootDevice(ctx, "cd")
		})
	}
	wg.Wait()
	if f.Calls("PowerOn") != 20 || f.Calls("SetBootDevice") != 20 {
		t.Fatalf("counters %v", f.AllCalls())
	}
}
