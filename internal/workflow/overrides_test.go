package workflow

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The table as data: what may be overridden in each built-in profile.
func TestOverridableSteps(t *testing.T) {
	want := map[string]string{
		"metal-enroll":        "power.getPower inspect.oob",
		"metal-enroll-inband": "bmc.provisionInband power.getPower inspect.oob",
		"metal-inspect":       "inventory.refresh",
		"metal-commission":    "firmware.check firmware.update bios.apply bios.verify diag.dcgm(level) disk.wipe(mode) power.off",
		"metal-release":       "firmware.update bios.apply bios.verify disk.wipe firmware.check power.off",
		"metal-retire":        "disk.wipe power.off",
		"metal-rescue":        "",
		"metal-unrescue":      "management.setBootDevice power.cycle",
	}
	for _, p := range Builtin() {
		if !Overridable(p.Name) {
			if _, ok := want[p.Name]; ok || p.Name != "default" {
				t.Errorf("%s: not overridable", p.Name)
			}
			continue
		}
		var got []string
		for _, s := range OverridableSteps(p.Name) {
			g := s.Use
			for _, a := range s.Args {
				g += "(" + a.Arg + ")"
			}
			got = append(got, g)
		}
		if g := strings.Join(got, " "); g != want[p.Name] {
			t.Errorf("%s: overridable %q, want %q", p.Name, g, want[p.Name])
		}
	}
	for _, name := range []string{"default", "gpu", "metal-nope", ""} {
		if Overridable(name) {
			t.Errorf("%q overridable", name)
		}
	}
	// Every argument the table lists exists in its profile, on a step that is always run (an
	// off value turns it off: it must not hide a condition).
	for _, a := range overrideArgs {
		p, ok := builtin(a.Profile)
		if !ok {
			t.Fatalf("table names unknown profile %s", a.Profile)
		}
		i := slices.IndexFunc(p.Steps, func(s Step) bool { return s.Use == a.Use })
		if i < 0 || p.Steps[i].Args[a.Arg] == "" || p.Steps[i].When != Always {
			t.Errorf("table entry %+v: no such unconditional step argument in %s", a, a.Profile)
		}
		if a.Off != "" && !slices.Contains(a.Values, a.Off) {
			t.Errorf("table entry %+v: off value not accepted", a)
		}
	}
}

// checkSafe asserts what no override may change: the steps (uses, order, conditions other than
// an off step's), every metal.revokeIdentity, boot.* and await.* step, the cleanup, and every
// argument but the table's.
func checkSafe(t *testing.T, what string, orig, got Profile) {
	t.Helper()
	if len(got.Steps) != len(orig.Steps) || fmt.Sprintf("%+v", got.Cleanup) != fmt.Sprintf("%+v", orig.Cleanup) {
		t.Fatalf("%s: steps %v cleanup %v, built in %v %v", what, got.Steps, got.Cleanup, orig.Steps, orig.Cleanup)
	}
	for i, st := range got.Steps {
		o := orig.Steps[i]
		if st.Use != o.Use || (st.When != o.When && st.When != WhenOverridden) {
			t.Errorf("%s: step %d is %s, built in %s", what, i, st, o)
		}
		if !Tunable(o.Use) && (st.String() != o.String() || st.Timeout != o.Timeout || st.Retries != o.Retries || st.On != o.On) {
			t.Errorf("%s: step %d %s changed to %s", what, i, o, st)
		}
		for k, v := range st.Args {
			listed := slices.ContainsFunc(overrideArgs, func(a overrideArg) bool { return a.Profile == orig.Name && a.Use == o.Use && a.Arg == k })
			if v != o.Args[k] && !listed {
				t.Errorf("%s: step %s argument %s changed to %q", what, o.Use, k, v)
			}
		}
		if orig.Name == "metal-release" && st.Use == "disk.wipe" && st.Args["mode"] != "$wipe" {
			t.Errorf("%s: release wipes %q, not the verb's mode", what, st.Args["mode"])
		}
		if orig.Name == "metal-retire" && st.Use == "disk.wipe" && st.Args["mode"] != "secure" {
			t.Errorf("%s: retire wipes %q", what, st.Args["mode"])
		}
	}
}

// Every allowed key and value of every built-in profile is accepted through ParseProfile (the
// file's and the API's path), changes what it says, keeps everything else, and resolves.
func TestOverrideAcceptsEveryAllowedValue(t *testing.T) {
	n := 0
	for _, p := range Builtin() {
		if !Overridable(p.Name) {
			continue
		}
		for _, s := range OverridableSteps(p.Name) {
			type tc struct {
				def   string
				check func(Step) bool
			}
			var cases []tc
			for _, a := range s.Args {
				for _, v := range a.Values {
					cases = append(cases, tc{fmt.Sprintf(`{"override":{%q:{"args":{%q:%q}}}}`, s.Use, a.Arg, v), func(st Step) bool {
						return st.Args[a.Arg] == v && (st.When == WhenOverridden) == (v == a.Off && a.Off != "")
					}})
				}
			}
			if Tunable(s.Use) {
				for _, d := range []string{"1s", "90m", "48h"} {
					want, _ := time.ParseDuration(d)
					cases = append(cases, tc{fmt.Sprintf(`{"override":{%q:{"timeout":%q}}}`, s.Use, d), func(st Step) bool { return st.Timeout == want }})
				}
				for r := 0; r <= maxRetries; r++ {
					cases = append(cases, tc{fmt.Sprintf(`{"override":{%q:{"retries":%d}}}`, s.Use, r), func(st Step) bool { return st.Retries == r }})
				}
			}
			for _, c := range cases {
				n++
				got, err := ParseProfile(p.Name, []byte(c.def))
				if err != nil {
					t.Errorf("%s %s: %v", p.Name, c.def, err)
					continue
				}
				checkSafe(t, p.Name+" "+c.def, p, got)
				res, err := Resolve(got, map[string]string{"wipe": "full", "image": "x"})
				if err != nil {
					t.Errorf("%s %s: resolving: %v", p.Name, c.def, err)
					continue
				}
				hit := 0
				for _, st := range res.Steps {
					if st.Use == s.Use && st.When != WhenNoMACs { // ensureRamdisk's own parts are not the profile's
						if !c.check(st) {
							t.Errorf("%s %s: resolved step %s (timeout %s, retries %d)", p.Name, c.def, st, st.Timeout, st.Retries)
						}
						hit++
					}
				}
				if hit == 0 {
					t.Errorf("%s %s: no resolved step %s", p.Name, c.def, s.Use)
				}
			}
		}
	}
	if n < 100 {
		t.Errorf("only %d overrides tried", n)
	}
}

// Everything else under a built-in name is refused, with a message that names what is accepted.
func TestOverrideRefusals(t *testing.T) {
	type bad struct{ profile, def, want string }
	var cases []bad
	// Every step of every built-in profile that is not overridable, with each kind of change.
	for _, p := range Builtin() {
		if !Overridable(p.Name) {
			continue
		}
		allowed := OverridableSteps(p.Name)
		accepted := "may be overridden in " + p.Name
		if len(allowed) == 0 {
			accepted = "nothing in " + p.Name + " may be overridden"
		}
		for _, st := range slices.Concat(p.Steps, p.Cleanup, []Step{{Use: "deploy.image"}, {Use: "no.such"}}) {
			if slices.ContainsFunc(allowed, func(a OverridableStep) bool { return a.Use == st.Use }) {
				continue
			}
			for _, body := range []string{`{"timeout":"1h"}`, `{"retries":1}`, `{"args":{"mode":"full"}}`, `{}`} {
				cases = append(cases, bad{p.Name, fmt.Sprintf(`{"override":{%q:%s}}`, st.Use, body), accepted})
			}
		}
		// An overridable step: arguments not in the table, values not accepted, bounds.
		for _, a := range allowed {
			cases = append(cases, bad{p.Name, fmt.Sprintf(`{"override":{%q:{"args":{"colour":"red"}}}}`, a.Use), "argument colour cannot be overridden: " + accepted})
			for _, r := range a.Args {
				for _, v := range []string{"", "5", "-1", "none", "QUICK", " 2"} {
					if !slices.Contains(r.Values, v) {
						cases = append(cases, bad{p.Name, fmt.Sprintf(`{"override":{%q:{"args":{%q:%q}}}}`, a.Use, r.Arg, v), "accepted are " + strings.Join(r.Values, ", ")})
					}
				}
			}
			if Tunable(a.Use) {
				for _, d := range []string{"0s", "500ms", "49h", "-1m", "forever"} {
					cases = append(cases, bad{p.Name, fmt.Sprintf(`{"override":{%q:{"timeout":%q}}}`, a.Use, d), "use a duration between 1s and 48h"})
				}
				for _, r := range []int{-1, 11, 99} {
					cases = append(cases, bad{p.Name, fmt.Sprintf(`{"override":{%q:{"retries":%d}}}`, a.Use, r), "accepted are 0-10"})
				}
			}
		}
		// Anything but an override.
		for _, def := range []string{
			`{"steps":[{"use":"power.off"}]}`,
			`{"override":{},"steps":[]}`,
			`{}`,
			`{"override":{"disk.wipe":{"args":{"mode":"full"},"when":"always"}}}`,
			`[]`,
			`{"override":{"disk.wipe":{"args":{"mode":2}}}}`,
		} {
			cases = append(cases, bad{p.Name, def, "is built in: it takes only {\"override\""})
		}
	}
	// Release's wipe mode is the verb's; retire's stays secure.
	for _, m := range []string{"quick", "full", "secure"} {
		cases = append(cases,
			bad{"metal-release", fmt.Sprintf(`{"override":{"disk.wipe":{"args":{"mode":%q}}}}`, m), "argument mode cannot be overridden: may be overridden in metal-release: firmware.update: timeout 1s-48h, retries 0-10; bios.apply: timeout 1s-48h, retries 0-10; bios.verify: timeout 1s-48h, retries 0-10; disk.wipe: timeout 1s-48h, retries 0-10; firmware.check: timeout 1s-48h, retries 0-10; power.off: timeout 1s-48h, retries 0-10"},
			bad{"metal-retire", fmt.Sprintf(`{"override":{"disk.wipe":{"args":{"mode":%q}}}}`, m), "argument mode cannot be overridden"})
	}
	cases = append(cases,
		bad{"metal-commission", `{"override":{"metal.ensureRamdisk":{"timeout":"1h"}}}`, "may be overridden in metal-commission: firmware.check: timeout 1s-48h, retries 0-10; firmware.update: timeout 1s-48h, retries 0-10; bios.apply: timeout 1s-48h, retries 0-10; bios.verify: timeout 1s-48h, retries 0-10; diag.dcgm: args.level 0|1|2|3|4 (0: the step does not run), timeout 1s-48h, retries 0-10; disk.wipe: args.mode quick|full|secure, timeout 1s-48h, retries 0-10; power.off: timeout 1s-48h, retries 0-10"},
		bad{"metal-retire", `{"override":{"metal.revokeIdentity":{}}}`, "step metal.revokeIdentity cannot be overridden"},
		bad{"metal-rescue", `{"override":{"metal.revokeIdentity":{}}}`, "nothing in metal-rescue may be overridden"},
	)
	for _, c := range cases {
		_, err := ParseProfile(c.profile, []byte(c.def))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v, want %q", c.profile, c.def, err, c.want)
		}
	}
	if len(cases) < 150 {
		t.Errorf("only %d refusals tried", len(cases))
	}
}

// Level 0: the step stays, marked off, resolves without its command kind, and the engine's
// condition never holds for it.
func TestOverrideLevelZero(t *testing.T) {
	p, err := ParseProfile("metal-commission", []byte(`{"override":{"diag.dcgm":{"args":{"level":"0"}},"disk.wipe":{"args":{"mode":"full"},"retries":2,"timeout":"30h"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	steps := func(p Profile) (string, Resolved) {
		t.Helper()
		r, err := Resolve(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, st := range r.Steps {
			st.Args = withoutFixed(st)
			got = append(got, st.String())
		}
		return strings.Join(got, " "), r
	}
	b, _ := builtin("metal-commission")
	want, _ := steps(b)
	want = strings.Replace(want, "diag.dcgm{level: 2}", "diag.dcgm?skippedByOverride{level: 0}", 1)
	want = strings.Replace(want, "disk.wipe{mode: quick}", "disk.wipe{mode: full}", 1)
	got, r := steps(p)
	if got != want || !strings.Contains(got, "bios.verify?biosSettings diag.dcgm?skippedByOverride{level: 0} disk.wipe{mode: full}") {
		t.Errorf("steps\n got %s\nwant %s", got, want)
	}
	if slices.Contains(r.CommandKinds, "diag.dcgm") || !slices.Contains(r.CommandKinds, "disk.wipe") {
		t.Errorf("command kinds %v", r.CommandKinds)
	}
	if i := slices.IndexFunc(r.Steps, func(s Step) bool { return s.Use == "disk.wipe" }); r.Steps[i].Retries != 2 || r.Steps[i].Timeout != 30*time.Hour {
		t.Errorf("wipe %+v", r.Steps[i])
	}
	for _, f := range []Facts{{}, {MACs: 1}, {FastTrackWindow: time.Minute, Rejoined: true}} {
		if WhenOverridden.Holds(f) {
			t.Errorf("skippedByOverride holds for %+v", f)
		}
	}
	// retries 0 means none, not the kind's.
	p, err = ParseProfile("metal-enroll", []byte(`{"override":{"power.getPower":{"retries":0}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := Resolve(p, nil); err != nil || r.Steps[0].Retries != 0 {
		t.Errorf("retries 0: %+v %v (the kind's are %d)", r.Steps, err, 3)
	}
	// The built-in profile is untouched by an override.
	b, _ = builtin("metal-commission")
	if i := slices.IndexFunc(b.Steps, func(s Step) bool { return s.Use == "diag.dcgm" }); b.Steps[i].Args["level"] != "2" || b.Steps[i].When != Always {
		t.Errorf("built-in changed: %v", b.Steps[i])
	}
	// "default" is a deploy profile: replaced whole, as before.
	if _, err := ParseProfile("default", []byte(`{"steps":[{"use":"metal.ensureRamdisk"}]}`)); err != nil {
		t.Errorf("default: %v", err)
	}
}

// builtinName answers for Builtin without building it: both name the same profiles.
func TestBuiltinNamesAreTheBuiltinProfiles(t *testing.T) {
	names := map[string]bool{}
	for _, p := range Builtin() {
		names[p.Name] = true
		if !builtinName(p.Name) {
			t.Errorf("builtinName(%q) = false for a built-in profile", p.Name)
		}
		if got, want := Overridable(p.Name), strings.HasPrefix(p.Name, "metal-"); got != want {
			t.Errorf("Overridable(%q) = %v, want %v", p.Name, got, want)
		}
		found, err := Find(p.Name, nil)
		if err != nil || found.Name != p.Name || len(found.Steps) != len(p.Steps) {
			t.Errorf("Find(%q) = %v, %v", p.Name, found.Name, err)
		}
	}
	for _, name := range []string{"metal-enroll", InbandEnrollProfile, "metal-inspect", "metal-commission", "metal-release",
		"metal-retire", "metal-rescue", "metal-unrescue", "default", "metal-", "metal-deploy", "Default", ""} {
		if builtinName(name) != names[name] {
			t.Errorf("builtinName(%q) = %v, Builtin has it: %v", name, builtinName(name), names[name])
		}
	}
	// A configured profile of a built-in's name is found first.
	mine := Profile{Name: "default", Steps: []Step{{Use: "power.on"}}}
	if p, err := Find("default", []Profile{mine}); err != nil || len(p.Steps) != 1 {
		t.Errorf("Find(default) with a configured default = %+v, %v", p, err)
	}
	if _, err := Find("nope", nil); err == nil {
		t.Error("Find(nope) found a profile")
	}
}
