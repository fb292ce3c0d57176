package engine

import (
	"testing"

	"bcd/internal/command"
)

func TestFastTrackable(t *testing.T) {
	tests := []struct {
		name                  string
		power                 string
		connectedAt, lastBoot int64
		want                  bool
	}{
		{"ramdisk joined after the last power cycle", "on", 200, 100, true},
		{"ramdisk joined and the node never power-cycled by us", "on", 200, 0, true},
		{"connection older than the last power cycle (a reset machine sends no FIN)", "on", 100, 200, false},
		{"joined in the same microsecond as the boot command", "on", 100, 100, false},
		{"no ramdisk connected", "on", 0, 0, false},
		{"powered off since", "off", 200, 100, false},
		{"power unknown", "unknown", 200, 100, false},
	}
	for _, tc := range tests {
		if got := FastTrackable(tc.power, tc.connectedAt, tc.lastBoot); got != tc.want {
			t.Errorf("%s: FastTrackable(%q, %d, %d) = %v, want %v", tc.name, tc.power, tc.connectedAt, tc.lastBoot, got, tc.want)
		}
	}
}

func TestLinger(t *testing.T) {
	const now = 1000
	tests := []struct {
		name string
		f    LingerFacts
		want LingerAction
	}{
		{"nothing lingers", LingerFacts{Now: now, Power: "on", RamdiskUp: true}, LingerNothing},
		{"window open", LingerFacts{Until: now + 1, Now: now, Power: "on", RamdiskUp: true}, LingerWait},
		{"window open, ramdisk not (yet) read", LingerFacts{Until: now + 1, Now: now, Power: "on"}, LingerWait},
		{"window passed: power off", LingerFacts{Until: now, Now: now, Power: "on", RamdiskUp: true}, LingerPowerOff},
		{"window passed, power unknown, ramdisk up: power off", LingerFacts{Until: now - 5, Now: now, RamdiskUp: true}, LingerPowerOff},
		{"window passed, node already off", LingerFacts{Until: now - 5, Now: now, Power: "off"}, LingerForget},
		{"window passed, ramdisk gone (crashed, or the node was booted since)", LingerFacts{Until: now - 5, Now: now, Power: "on"}, LingerForget},
		{"window passed but a workflow holds the node (the deploy at the last second)", LingerFacts{Until: now - 5, Now: now, Held: true, Power: "on", RamdiskUp: true}, LingerNothing},
		{"window open and a workflow holds the node", LingerFacts{Until: now + 5, Now: now, Held: true, Power: "on", RamdiskUp: true}, LingerNothing},
		{"power-off queued, ramdisk up", LingerFacts{Until: now - 5, Now: now, Power: "on", RamdiskUp: true, Command: command.Queued}, LingerWait},
		{"power-off queued, ramdisk gone before taking it", LingerFacts{Until: now - 5, Now: now, Power: "on", Command: command.Queued}, LingerAbandon},
		{"power-off delivered", LingerFacts{Until: now - 5, Now: now, Power: "on", Command: command.Delivered}, LingerWait},
		{"power-off running", LingerFacts{Until: now - 5, Now: now, Power: "on", Command: command.Running}, LingerWait},
		{"power-off reported", LingerFacts{Until: now - 5, Now: now, Power: "on", Command: command.Succeeded}, LingerPoweredOff},
		{"ramdisk gone after taking the power-off", LingerFacts{Until: now - 5, Now: now, Power: "on", Command: command.Lost}, LingerPoweredOff},
		{"ramdisk refused the power-off", LingerFacts{Until: now - 5, Now: now, Power: "on", RamdiskUp: true, Command: command.Failed}, LingerRefused},
		{"power-off out but a workflow holds the node", LingerFacts{Until: now - 5, Now: now, Held: true, Command: command.Queued}, LingerNothing},
	}
	for _, tc := range tests {
		if got := Linger(tc.f); got != tc.want {
			t.Errorf("%s: Linger(%+v) = %s, want %s", tc.name, tc.f, got, tc.want)
		}
	}
	// Every combination: a power-off is sent only to a ramdisk that is up, when no workflow
	// holds the node, none was sent yet, the window passed and the node is not known to be off;
	// a workflow-held node is never acted on; only an unclaimed power-off is abandoned.
	for _, held := range []bool{false, true} {
		for _, up := range []bool{false, true} {
			for _, until := range []int64{0, now - 1, now, now + 1} {
				for _, power := range []string{"", "on", "off"} {
					for _, cs := range []command.State{"", command.Queued, command.Delivered, command.Running, command.Succeeded, command.Failed, command.Lost} {
						f := LingerFacts{Until: until, Now: now, Held: held, Power: power, RamdiskUp: up, Command: cs}
						got := Linger(f)
						send := !held && up && cs == "" && until != 0 && now >= until && power != "off"
						if (got == LingerPowerOff) != send {
							t.Errorf("Linger(%+v) = %s: power-off sent %v, want %v", f, got, got == LingerPowerOff, send)
						}
						if held && got != LingerNothing {
							t.Errorf("Linger(%+v) = %s for a workflow-held node", f, got)
						}
						if got == LingerAbandon && (cs != command.Queued || up) {
							t.Errorf("Linger(%+v) = abandon", f)
						}
						if got == LingerWait && cs == "" && now >= until {
							t.Errorf("Linger(%+v) waits after the window", f)
						}
					}
				}
			}
		}
	}
}
