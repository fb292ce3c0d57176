package command

import (
	"strings"
	"testing"
)

func TestKindTable(t *testing.T) {
	want := map[string]string{ // runs on, destructive, attested, reroutable, self-terminating
		"bmc.query":           "site .... reroutable .",
		"bmc.boot":            "site destructive . reroutable .",
		"bmc.power":           "site destructive . reroutable .",
		"bmc.rotate":          "site destructive . reroutable .",
		"bmc.bios":            "site destructive . reroutable .",
		"bmc.firmware":        "site destructive . reroutable .",
		"bmc.console":         "site . . reroutable .",
		"site.httpProxy":      "site destructive . reroutable .",
		"boot.prepareRamdisk": "site . . reroutable .",
		"boot.cleanUp":        "site . . reroutable .",
		"diag.dcgm":           "ramdisk . attested . .",
		"disk.wipe":           "ramdisk destructive attested . .",
		"deploy.image":        "ramdisk destructive . . .",
		"deploy.configDrive":  "ramdisk destructive . . .",
		"boot.kexec":          "ramdisk destructive . . selfterminating",
		"ramdisk.powerOff":    "ramdisk . . . .",
	}
	flag := func(b bool, s string) string {
		if b {
			return s
		}
		return "."
	}
	for name, w := range want {
		k, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		got := string(k.RunsOn) + " " + flag(k.Destructive, "destructive") + " " + flag(k.Attested, "attested") + " " + flag(k.Reroutable, "reroutable") + " " + flag(k.SelfTerminating, "selfterminating")
		if name == "bmc.query" {
			got = string(k.RunsOn) + " " + flag(k.Destructive || k.Attested, "x") + "... " + flag(k.Reroutable, "reroutable") + " " + flag(k.SelfTerminating, "x")
		}
		if got != w {
			t.Errorf("%s: %q, want %q", name, got, w)
		}
	}
	// Every kind that acts on the node's BMC carries its credentials; no other kind does (a
	// kind left out reaches a real site agent with none: "credentials are missing").
	for _, k := range Kinds() {
		bmc := strings.HasPrefix(k.Name, "bmc.")
		if k.BMCCredentials != bmc {
			t.Errorf("%s: BMCCredentials %v", k.Name, k.BMCCredentials)
		}
	}
	if _, err := Lookup("bmc.format"); err == nil {
		t.Error("unknown kind accepted")
	}
	// What an agent never acknowledged never ran: every site kind may move to another agent.
	for _, k := range Kinds() {
		if k.Reroutable != (k.RunsOn == OnSite) {
			t.Errorf("%s runs on %s, reroutable %v", k.Name, k.RunsOn, k.Reroutable)
		}
	}
}

func TestLife(t *testing.T) {
	all := []State{Queued, Delivered, Running, Succeeded, Failed, Lost}
	order := map[State]int{Queued: 0, Delivered: 1, Running: 2, Succeeded: 3, Failed: 3, Lost: 3}
	for _, from := range all {
		for _, to := range all {
			want := !from.Final() && order[to] > order[from]
			if got := CanMove(from, to); got != want {
				t.Errorf("%s → %s: %v, want %v", from, to, got, want)
			}
		}
	}
	power, _ := Lookup("bmc.power")
	wipe, _ := Lookup("disk.wipe")
	kexec, _ := Lookup("boot.kexec")
	cases := []struct {
		s       State
		k       Kind
		next    State
		release bool
	}{
		{Queued, power, Queued, true},   // never acknowledged: another agent may run it
		{Delivered, power, Lost, false}, // acknowledged: never sent twice
		{Running, power, Lost, false},
		{Queued, wipe, Queued, false}, // a node's ramdisk command waits for the same node
		{Running, wipe, Lost, false},
		{Succeeded, power, Succeeded, false},
		{Queued, kexec, Queued, false},       // never taken: waits for the node's ramdisk
		{Delivered, kexec, Delivered, false}, // its ramdisk leaving is how it runs: its step settles it
		{Running, kexec, Running, false},
		{Failed, kexec, Failed, false},
	}
	for _, c := range cases {
		next, rel := AgentGone(c.s, c.k)
		if next != c.next || rel != c.release {
			t.Errorf("%s %s: %s %v, want %s %v", c.k.Name, c.s, next, rel, c.next, c.release)
		}
	}
	// Every kind in every state: an acknowledged command is never released (never sent
	// twice), and only a self-terminating one is not lost; a final one stays as it is.
	for _, k := range Kinds() {
		for _, s := range []State{Queued, Delivered, Running, Succeeded, Failed, Lost} {
			next, rel := AgentGone(s, k)
			switch {
			case s == Queued && (next != Queued || rel != k.Reroutable):
				t.Errorf("%s %s: %s %v, want queued, released if reroutable", k.Name, s, next, rel)
			case s != Queued && rel:
				t.Errorf("%s %s: released once acknowledged", k.Name, s)
			case s.Final() && next != s:
				t.Errorf("%s %s: moved to %s", k.Name, s, next)
			case (s == Delivered || s == Running) && k.SelfTerminating && next != s:
				t.Errorf("%s %s: %s, want left for its step", k.Name, s, next)
			case (s == Delivered || s == Running) && !k.SelfTerminating && next != Lost:
				t.Errorf("%s %s: %s, want lost", k.Name, s, next)
			}
		}
	}
}
