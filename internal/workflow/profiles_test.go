package workflow

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/command"
)

func TestBuiltinProfilesResolve(t *testing.T) {
	params := map[string]string{"wipe": "full", "image": "debian"}
	want := map[string]string{
		"metal-enroll":        "power.getPower inspect.oob",
		"metal-enroll-inband": "boot.prepareRamdisk await.ramdisk bmc.provisionInband power.getPower inspect.oob",
		"metal-inspect":       "management.setBootDevice?noMacs{device: pxe} power.cycle?noMacs await.macCandidate?noMacs boot.prepareRamdisk management.setBootDevice{device: pxe} power.cycle await.ramdisk inventory.refresh metal.linger",
		"metal-commission":    "firmware.check?firmwareBaselineNoImages firmware.update?firmwareImages bios.apply?biosSettings management.setBootDevice?noMacs{device: pxe} power.cycle?noMacs await.macCandidate?noMacs boot.prepareRamdisk management.setBootDevice{device: pxe} power.cycle await.ramdisk firmware.check?firmwareImages bios.verify?biosSettings diag.dcgm{level: 2} disk.wipe{mode: quick} power.off?noFastTrack metal.linger?fastTrack",
		"metal-release":       "metal.revokeIdentity firmware.update?firmwareImages bios.apply?biosSettings management.setBootDevice?noMacs{device: pxe} power.cycle?noMacs await.macCandidate?noMacs boot.prepareRamdisk management.setBootDevice{device: pxe} power.cycle await.ramdisk bios.verify?biosSettings disk.wipe{mode: full} firmware.check?firmwareBaseline power.off?noFastTrack metal.linger?fastTrack",
		"metal-retire":        "metal.revokeIdentity management.setBootDevice?noMacs{device: pxe} power.cycle?noMacs await.macCandidate?noMacs boot.prepareRamdisk management.setBootDevice{device: pxe} power.cycle await.ramdisk disk.wipe{mode: secure} power.off metal.revokeIdentity",
		"metal-rescue":        "metal.revokeIdentity management.setBootDevice?noMacs{device: pxe} power.cycle?noMacs await.macCandidate?noMacs boot.prepareRamdisk management.setBootDevice{device: pxe} power.cycle await.ramdisk",
		"metal-unrescue":      "management.setBootDevice{device: disk, persistent: true} boot.prepareInstance power.cycle await.rejoin",
		"default":             "management.setBootDevice?noMacs{device: pxe} power.cycle?noMacs await.macCandidate?noMacs boot.prepareRamdisk management.setBootDevice{device: pxe} power.cycle await.ramdisk deploy.image{image: debian} management.setBootDevice{device: disk, persistent: true} boot.prepareInstance boot.kexecOnce power.cycle?notRejoined await.rejoin?notRejoined",
	}
	for _, p := range Builtin() {
		r, err := Resolve(p, params)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, st := range r.Steps {
			st.Args = withoutFixed(st)
			got = append(got, st.String())
			if st.Timeout == 0 {
				t.Errorf("%s: step %s has no timeout", p.Name, st.Use)
			}
		}
		if g := strings.Join(got, " "); g != want[p.Name] {
			t.Errorf("%s:\n got %s\nwant %s", p.Name, g, want[p.Name])
		}
		for _, k := range r.CommandKinds {
			if _, err := command.Lookup(k); err != nil {
				t.Errorf("%s sends unknown kind %s", p.Name, k)
			}
		}
		if p.Name == "metal-release" && !slices.Contains(r.CommandKinds, "disk.wipe") {
			t.Errorf("release kinds %v", r.CommandKinds)
		}
	}
}

func TestConditionHolds(t *testing.T) {
	for _, tc := range []struct {
		c    Condition
		f    Facts
		want bool
	}{
		{Always, Facts{}, true}, {Always, Facts{MACs: 2, FastTrackWindow: time.Minute}, true},
		{WhenNoMACs, Facts{}, true}, {WhenNoMACs, Facts{MACs: 1}, false}, {WhenNoMACs, Facts{MACs: 3, FastTrackWindow: time.Minute}, false},
		{WhenFastTrack, Facts{}, false}, {WhenFastTrack, Facts{FastTrackWindow: time.Second}, true}, {WhenFastTrack, Facts{MACs: 0, FastTrackWindow: -time.Second}, false},
		{WhenNoFastTrack, Facts{}, true}, {WhenNoFastTrack, Facts{FastTrackWindow: time.Second}, false}, {WhenNoFastTrack, Facts{MACs: 1}, true},
		{WhenNotRejoined, Facts{}, true}, {WhenNotRejoined, Facts{Rejoined: true}, false}, {WhenNotRejoined, Facts{MACs: 1, FastTrackWindow: time.Second}, true},
		{WhenNoMACs, Facts{Rejoined: true}, true}, {Always, Facts{Rejoined: true}, true},
		{WhenFirmwareBaseline, Facts{}, false}, {WhenFirmwareBaseline, Facts{Baseline: true}, true},
		{WhenFirmwareBaseline, Facts{MACs: 2, FastTrackWindow: time.Second, Rejoined: true}, false}, {Always, Facts{Baseline: true}, true},
		{WhenNoMACs, Facts{Baseline: true}, true},
		{WhenBIOSSettings, Facts{}, false}, {WhenBIOSSettings, Facts{BIOS: true}, true}, {WhenBIOSSettings, Facts{Baseline: true}, false},
		{WhenFirmwareBaseline, Facts{BIOS: true}, false}, {Always, Facts{BIOS: true}, true},
		{WhenFirmwareImages, Facts{}, false}, {WhenFirmwareImages, Facts{FirmwareImages: true}, true}, {WhenFirmwareImages, Facts{Baseline: true}, false},
		{WhenBaselineNoImages, Facts{Baseline: true}, true}, {WhenBaselineNoImages, Facts{Baseline: true, FirmwareImages: true}, false},
		{WhenBaselineNoImages, Facts{}, false}, {WhenFirmwareBaseline, Facts{Baseline: true, FirmwareImages: true}, true},
	} {
		if got := tc.c.Holds(tc.f); got != tc.want {
			t.Errorf("%q.Holds(%+v) = %v, want %v", tc.c, tc.f, got, tc.want)
		}
	}
}

func TestParseFastTrackWindow(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 3 * time.Minute, false}, // the default
		{"0s", 0, false}, {"0", 0, false}, {"10m", 10 * time.Minute, false}, {"24h", 24 * time.Hour, false},
		{"25h", 0, true}, {"-1m", 0, true}, {"ten minutes", 0, true}, {"10", 0, true},
	} {
		got, err := ParseFastTrackWindow(tc.in, 3*time.Minute)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseFastTrackWindow(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestReadyWorkflowsEndPoweredOffOrLingering: every built-in workflow that leaves the node ready
// ends either in power.off (window 0) or metal.linger (window open), exactly one of them for any
// window; inspection always lingers.
func TestReadyWorkflowsEndPoweredOffOrLingering(t *testing.T) {
	for _, name := range []string{"metal-commission", "metal-release", "metal-inspect"} {
		p, err := Find(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Resolve(p, map[string]string{"wipe": "quick"})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []time.Duration{0, time.Minute} {
			var ends []string
			for _, st := range r.Steps {
				if (st.Use == "power.off" || st.Use == "metal.linger") && st.When.Holds(Facts{MACs: 1, FastTrackWindow: w}) {
					ends = append(ends, st.Use)
				}
			}
			want := "metal.linger"
			if w == 0 && name != "metal-inspect" {
				want = "power.off"
			}
			if len(ends) != 1 || ends[0] != want {
				t.Errorf("%s with window %s ends with %v, want [%s]", name, w, ends, want)
			}
			if last := r.Steps[len(r.Steps)-1]; last.Use != "metal.linger" {
				t.Errorf("%s: last step %s, want metal.linger", name, last)
			}
		}
	}
}

// withoutFixed drops the arguments the step kind adds itself, to compare with the profile text.
func withoutFixed(st Step) map[string]string {
	k, _ := LookupStep(st.Use)
	out := map[string]string{}
	for key, v := range st.Args {
		if k.Args[key] != v {
			out[key] = v
		}
	}
	return out
}

func TestResolveRefusals(t *testing.T) {
	rel, _ := Find("metal-release", nil)
	if _, err := Resolve(rel, nil); err == nil || !strings.Contains(err.Error(), `needs parameter "wipe"`) {
		t.Errorf("missing parameter: %v", err)
	}
	if _, err := Resolve(Profile{Name: "x", Steps: []Step{{Use: "disk.shred"}}}, nil); err == nil || !strings.Contains(err.Error(), "unknown step") {
		t.Errorf("unknown step: %v", err)
	}
	if _, err := Resolve(Profile{Name: "x", Steps: []Step{{Use: "power.off"}}, Sends: []string{"site.teleport"}}, nil); err == nil {
		t.Error("unknown declared send accepted")
	}
	r, err := Resolve(Profile{Name: "plugin", Steps: []Step{{Use: "power.off"}}, Sends: []string{"site.httpProxy"}}, nil)
	// bmc.query: the power query that settles a lost power.off.
	if err != nil || !slices.Equal(r.CommandKinds, []string{"bmc.power", "bmc.query", "site.httpProxy"}) {
		t.Errorf("declared sends: %v %v", r.CommandKinds, err)
	}
	if _, err := Find("nope", nil); err == nil {
		t.Error("unknown profile found")
	}
}

func TestParseProfile(t *testing.T) {
	good := `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"},"timeout":"90m","retries":1},{"use":"boot.kexec"}],"cleanup":[{"use":"boot.cleanUp"}]}`
	p, err := ParseProfile("gpu", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Resolve(p, map[string]string{"image": "ubuntu"})
	if err != nil || len(r.Steps) != 11 || r.Steps[7].Timeout.Minutes() != 90 || r.Steps[7].Args["image"] != "ubuntu" {
		t.Fatalf("resolved %+v %v", r.Steps, err)
	}
	for _, bad := range []struct{ def, want string }{
		{`{"steps":[]}`, "no steps"},
		{`{"steps":[{"use":"disk.shred"}]}`, "unknown step"},
		{`{"steps":[{"use":"power.off","timeout":"forever"}]}`, "use a duration"},
		{`{"steps":[{"use":"power.off","retries":99}]}`, "accepted are 0-10"},
		{`{"steps":[{"use":"power.off"}],"colour":"red"}`, "unknown field"},
		{`{"steps":[{"use":"power.off"}],"sends":["bmc.explode"]}`, "unknown command kind"},
		{`{"steps":[{"use":"boot.kexec","timeout":"30m"}]}`, "is made of boot.kexecOnce, power.cycle, await.rejoin"},
		{`{"steps":[{"use":"metal.ensureRamdisk","retries":2}]}`, "takes no timeout or retries"},
	} {
		if _, err := ParseProfile("x", []byte(bad.def)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.def, err, bad.want)
		}
	}
}

// Every step kind, with every power action: a query settles only a lost power on or off, and the
// query's kind is among what the profile may send.
func TestLostCheckFor(t *testing.T) {
	for _, k := range stepKinds {
		for _, action := range []string{"", "on", "off", "cycle", "reset"} {
			st := Step{Use: k.Use, Args: map[string]string{}}
			maps.Copy(st.Args, k.Args)
			if action != "" && k.Args["action"] == "" {
				st.Args["action"] = action
			}
			got, ok := LostCheckFor(k, st)
			a := st.Args["action"]
			wantOK := k.Command == "bmc.power" && (a == "on" || a == "off")
			if ok != wantOK || ok && (got.Query != "power" || got.Want != a) {
				t.Errorf("%s{action: %s}: check %+v %v, want one only for a power on or off (power = %s)", k.Use, a, got, ok, a)
			}
		}
	}
	for _, c := range []struct {
		steps []Step
		query bool
	}{
		{[]Step{{Use: "power.off"}}, true},
		{[]Step{{Use: "power.setPower", Args: map[string]string{"action": "on"}}}, true},
		{[]Step{{Use: "power.cycle"}}, false},
		{[]Step{{Use: "disk.wipe", Args: map[string]string{"mode": "quick"}}}, false},
	} {
		r, err := Resolve(Profile{Name: "x", Steps: c.steps}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(r.CommandKinds, "bmc.query"); got != c.query {
			t.Errorf("%v: may send bmc.query: %v, want %v", c.steps, got, c.query)
		}
	}
}

// A step that retries from an earlier step finds one of that use before it, in every built-in
// profile.
func TestRetryFromComesBefore(t *testing.T) {
	found := 0
	for _, p := range Builtin() {
		r, err := Resolve(p, map[string]string{"wipe": "quick", "image": "x"})
		if err != nil {
			t.Fatal(err)
		}
		for _, steps := range [][]Step{r.Steps, r.Cleanup} {
			for i, st := range steps {
				if st.RetryFrom == "" {
					continue
				}
				found++
				if !slices.ContainsFunc(steps[:i], func(s Step) bool { return s.Use == st.RetryFrom }) {
					t.Errorf("%s: step %d %s retries from %s, which does not come before it", p.Name, i, st, st.RetryFrom)
				}
			}
		}
	}
	if found == 0 {
		t.Error("no built-in step retries from an earlier one")
	}
}

// A step's arguments reach an agent as written: a fixed argument of its kind cannot be changed
// (a power off that cycles), a routing must name where its command runs, and the arguments with
// known values (power action, boot device, wipe mode, diagnostics level) hold one of them, after
// the workflow's parameters are filled in.
func TestResolveValidatesStepArgs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		step   Step
		params map[string]string
		want   string // "" accepted; else in the error
	}{
		{"power off", Step{Use: "power.off"}, nil, ""},
		{"power off that cycles", Step{Use: "power.off", Args: map[string]string{"action": "cycle"}}, nil, "cannot be set"},
		{"power query that reads the inventory", Step{Use: "power.getPower", Args: map[string]string{"query": "inventory"}}, nil, "cannot be set"},
		{"power off, fixed action restated", Step{Use: "power.off", Args: map[string]string{"action": "off"}}, nil, ""},
		{"setPower on", Step{Use: "power.setPower", Args: map[string]string{"action": "on"}}, nil, ""},
		{"setPower without action", Step{Use: "power.setPower"}, nil, "action is required"},
		{"setPower explode", Step{Use: "power.setPower", Args: map[string]string{"action": "explode"}}, nil, `action "explode"`},
		{"boot device floppy", Step{Use: "management.setBootDevice", Args: map[string]string{"device": "floppy"}}, nil, `device "floppy"`},
		{"boot device without device", Step{Use: "management.setBootDevice"}, nil, "device is required"},
		{"boot device persistent maybe", Step{Use: "management.setBootDevice", Args: map[string]string{"device": "disk", "persistent": "maybe"}}, nil, `persistent "maybe"`},
		{"boot device cd uefi", Step{Use: "management.setBootDevice", Args: map[string]string{"device": "cd", "mode": "uefi"}}, nil, ""},
		{"wipe mode none", Step{Use: "disk.wipe", Args: map[string]string{"mode": "none"}}, nil, `mode "none"`},
		{"wipe without mode", Step{Use: "disk.wipe"}, nil, "mode is required"},
		{"wipe mode from a bad parameter", Step{Use: "disk.wipe", Args: map[string]string{"mode": "$wipe"}}, map[string]string{"wipe": "skip"}, `mode "skip"`},
		{"wipe mode from a parameter", Step{Use: "disk.wipe", Args: map[string]string{"mode": "$wipe"}}, map[string]string{"wipe": "secure"}, ""},
		{"dcgm level 9", Step{Use: "diag.dcgm", Args: map[string]string{"level": "9"}}, nil, `level "9"`},
		{"dcgm level 4", Step{Use: "diag.dcgm", Args: map[string]string{"level": "4"}}, nil, ""},
		{"image without image", Step{Use: "deploy.image"}, nil, "image is required"},
		{"wipe with a misspelt mode", Step{Use: "disk.wipe", Args: map[string]string{"mode": "quick", "mdoe": "full"}}, nil, "takes no argument mdoe: it takes mode"},
		{"media insert names its ISO", Step{Use: "media.insert", Args: map[string]string{"image": "rescue-iso"}}, nil, ""},
		{"media insert with a device", Step{Use: "media.insert", Args: map[string]string{"image": "rescue-iso", "device": "cd"}}, nil, "takes no argument device: it takes image"},
		{"inventory with an argument", Step{Use: "inventory.refresh", Args: map[string]string{"full": "true"}}, nil, "takes no argument full: it takes none"},
		{"power off with an argument", Step{Use: "power.off", Args: map[string]string{"soft": "true"}}, nil, "takes no argument soft: it takes none"},
		{"routed where it runs", Step{Use: "power.setPower", On: "site", Args: map[string]string{"action": "off"}}, nil, ""},
		{"routed elsewhere", Step{Use: "disk.wipe", On: "site", Args: map[string]string{"mode": "quick"}}, nil, "runs on ramdisk only"},
		{"routed nowhere", Step{Use: "power.off", On: "moon"}, nil, `on: "moon"`},
		{"routing a step that sends nothing", Step{Use: "await.ramdisk", On: "ramdisk"}, nil, "sends no command"},
		{"plugin relay", Step{Use: "plugin.httpViaSite"}, nil, ""},
	} {
		_, err := Resolve(Profile{Name: "p", Steps: []Step{tc.step}, Sends: []string{"site.httpProxy"}}, tc.params)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
		// Cleanup steps are checked alike.
		_, cerr := Resolve(Profile{Name: "p", Steps: []Step{{Use: "power.off"}}, Cleanup: []Step{tc.step}, Sends: []string{"site.httpProxy"}}, tc.params)
		if (cerr == nil) != (err == nil) {
			t.Errorf("%s: as a cleanup step: %v, as a step: %v", tc.name, cerr, err)
		}
	}
	// An operator's profile is refused when it is stored, not when a node runs it.
	if _, err := ParseProfile("x", []byte(`{"steps":[{"use":"power.off","args":{"action":"cycle"}}]}`)); err == nil {
		t.Error("ParseProfile accepted a power off that cycles")
	}
}

// RetryLost, over every built-in step: only a lost power action no query settles, outside a
// retry from an earlier step, is never sent again.
func TestRetryLost(t *testing.T) {
	for _, p := range Builtin() {
		r, err := Resolve(p, map[string]string{"wipe": "quick", "image": "x"})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range slices.Concat(r.Steps, r.Cleanup) {
			k, _ := LookupStep(st.Use)
			_, settled := LostCheckFor(k, st)
			want := k.Command != "bmc.power" || settled || st.RetryFrom != ""
			if got := RetryLost(k, st); got != want {
				t.Errorf("%s: %s: RetryLost %v, want %v", p.Name, st, got, want)
			}
		}
	}
	cycle, _ := LookupStep("power.cycle")
	if RetryLost(cycle, Step{Use: "power.cycle", Args: map[string]string{"action": "cycle"}}) {
		t.Error("a lost power cycle is sent again")
	}
	set, _ := LookupStep("power.setPower")
	for action, want := range map[string]bool{"on": true, "off": true, "cycle": false, "reset": false, "soft": false} {
		if got := RetryLost(set, Step{Use: "power.setPower", Args: map[string]string{"action": action}}); got != want {
			t.Errorf("setPower{action: %s} lost: retried %v, want %v", action, got, want)
		}
	}
}
