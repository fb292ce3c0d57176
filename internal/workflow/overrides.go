package workflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Built-in profile overrides (DESIGN §12): an operator tunes a built-in metal-* profile without
// replacing it. What may change is data (overrideArgs, Tunable); ApplyOverride is pure. An
// override never adds, removes or reorders steps, never touches a metal.revokeIdentity, a
// boot.* or await.* step, or a composite step, and never changes an argument the table does not
// list: release's wipe mode stays the verb's, retire's stays secure.

// WhenOverridden: an override turned the step off (diag.dcgm level 0). The step stays in the
// workflow and the engine records it as skipped by override: nothing is skipped silently.
const WhenOverridden Condition = "skippedByOverride"

// noRetries is what an override's "retries": 0 becomes in the profile: Resolve reads a step's
// 0 as "the kind's retries", and the operator asked for none.
const noRetries = -1

// Bounds of an override's (and an operator profile's) timeout and retries.
const (
	minStepTimeout = time.Second
	maxStepTimeout = 48 * time.Hour
	maxRetries     = 10
)

// overrideArg is an argument of a built-in profile's step that an override may set, with the
// values it accepts. Off, when set, is the value that turns the step off.
type overrideArg struct {
	Profile, Use, Arg string
	Values            []string
	Off               string
}

// overrideArgs is every argument an override may set. Release's wipe mode is the undeploy
// verb's and retire's is secure: neither is here.
var overrideArgs = []overrideArg{
	{Profile: "metal-commission", Use: "diag.dcgm", Arg: "level", Values: []string{"0", "1", "2", "3", "4"}, Off: "0"},
	{Profile: "metal-commission", Use: "disk.wipe", Arg: "mode", Values: []string{"quick", "full", "secure"}},
}

// Overridable reports whether name is a built-in profile that takes overrides (the metal-*
// ones; "default" is a deploy profile an operator replaces whole).
func Overridable(name string) bool {
	return strings.HasPrefix(name, "metal-") && builtinName(name)
}

// builtinName reports whether name is the name of a built-in profile, without building them:
// the engine asks at every workflow it starts (TestBuiltinNamesAreTheBuiltinProfiles).
func builtinName(name string) bool {
	switch name {
	case "metal-enroll", InbandEnrollProfile, "metal-inspect", "metal-commission", "metal-release",
		"metal-retire", "metal-rescue", "metal-unrescue", "default":
		return true
	}
	return false
}

func builtin(name string) (Profile, bool) {
	if !builtinName(name) {
		return Profile{}, false
	}
	for _, p := range Builtin() {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// Tunable reports whether an override may set the timeout and retries of a built-in step of
// use: a step that sends a command of its own. Composite steps take none (their parts have
// theirs), boot.* and await.* steps keep the boot sequence's timing, control-plane steps
// (metal.*) have nothing to wait for. Pure.
func Tunable(use string) bool {
	k, err := LookupStep(use)
	if err != nil || len(k.Expand) > 0 || k.ControlPlane || k.Command == "" {
		return false
	}
	return !strings.HasPrefix(use, "boot.") && !strings.HasPrefix(use, "await.")
}

// StepOverride is what an override changes in the steps of one use.
type StepOverride struct {
	Args    map[string]string
	Timeout time.Duration // 0: unchanged
	Retries *int          // nil: unchanged
}

// Override is a built-in profile's override: by step use.
type Override map[string]StepOverride

// OverridableStep is one step of a built-in profile an override may change.
type OverridableStep struct {
	Use  string
	Args []overrideArg
}

// OverridableSteps lists what an override of the built-in profile may change, in the
// profile's step order.
func OverridableSteps(profile string) []OverridableStep {
	p, ok := builtin(profile)
	if !ok {
		return nil
	}
	var out []OverridableStep
	seen := map[string]bool{}
	for _, st := range p.Steps {
		if seen[st.Use] {
			continue
		}
		seen[st.Use] = true
		o := OverridableStep{Use: st.Use}
		for _, a := range overrideArgs {
			if a.Profile == profile && a.Use == st.Use {
				o.Args = append(o.Args, a)
			}
		}
		if len(o.Args) > 0 || Tunable(st.Use) {
			out = append(out, o)
		}
	}
	return out
}

// describeOverridable says what may be overridden in profile, for errors.
func describeOverridable(profile string) string {
	steps := OverridableSteps(profile)
	if len(steps) == 0 {
		return "nothing in " + profile + " may be overridden"
	}
	var parts []string
	for _, s := range steps {
		var what []string
		for _, a := range s.Args {
			vals := strings.Join(a.Values, "|")
			if a.Off != "" {
				vals += " (" + a.Off + ": the step does not run)"
			}
			what = append(what, "args."+a.Arg+" "+vals)
		}
		if Tunable(s.Use) {
			what = append(what, "timeout 1s-48h", fmt.Sprintf("retries 0-%d", maxRetries))
		}
		parts = append(parts, s.Use+": "+strings.Join(what, ", "))
	}
	return "may be overridden in " + profile + ": " + strings.Join(parts, "; ")
}

// ApplyOverride returns the built-in profile p with o applied, or an error naming what may be
// overridden. Every step of an overridden use changes (metal-retire's power.off is one step;
// no tunable use appears twice in a built-in profile). Pure.
func ApplyOverride(p Profile, o Override) (Profile, error) {
	if !Overridable(p.Name) {
		return Profile{}, fmt.Errorf("profile %s is not a built-in profile that takes overrides", p.Name)
	}
	out := Profile{Name: p.Name, Steps: slices.Clone(p.Steps), Cleanup: slices.Clone(p.Cleanup), Sends: slices.Clone(p.Sends)}
	allowed := map[string]OverridableStep{}
	for _, s := range OverridableSteps(p.Name) {
		allowed[s.Use] = s
	}
	for _, use := range slices.Sorted(maps.Keys(o)) {
		so := o[use]
		a, ok := allowed[use]
		if !ok {
			return Profile{}, fmt.Errorf("profile %s: step %s cannot be overridden: %s", p.Name, use, describeOverridable(p.Name))
		}
		if (so.Timeout != 0 || so.Retries != nil) && !Tunable(use) {
			return Profile{}, fmt.Errorf("profile %s: step %s takes no timeout or retries: %s", p.Name, use, describeOverridable(p.Name))
		}
		if so.Timeout != 0 && (so.Timeout < minStepTimeout || so.Timeout > maxStepTimeout) {
			return Profile{}, fmt.Errorf("profile %s: step %s: timeout %s: use a duration between 1s and 48h", p.Name, use, so.Timeout)
		}
		if so.Retries != nil && (*so.Retries < 0 || *so.Retries > maxRetries) {
			return Profile{}, fmt.Errorf("profile %s: step %s: retries %d: accepted are 0-%d", p.Name, use, *so.Retries, maxRetries)
		}
		var off bool
		for _, key := range slices.Sorted(maps.Keys(so.Args)) {
			v := so.Args[key]
			i := slices.IndexFunc(a.Args, func(r overrideArg) bool { return r.Arg == key })
			if i < 0 {
				return Profile{}, fmt.Errorf("profile %s: step %s: argument %s cannot be overridden: %s", p.Name, use, key, describeOverridable(p.Name))
			}
			r := a.Args[i]
			if !slices.Contains(r.Values, v) {
				return Profile{}, fmt.Errorf("profile %s: step %s: argument %s %q: accepted are %s", p.Name, use, key, v, strings.Join(r.Values, ", "))
			}
			off = off || (r.Off != "" && v == r.Off)
		}
		for i, st := range out.Steps {
			if st.Use != use {
				continue
			}
			st.Args = maps.Clone(st.Args)
			if st.Args == nil && len(so.Args) > 0 {
				st.Args = map[string]string{}
			}
			maps.Copy(st.Args, so.Args)
			if so.Timeout != 0 {
				st.Timeout = so.Timeout
			}
			if so.Retries != nil {
				st.Retries = *so.Retries
				if st.Retries == 0 {
					st.Retries = noRetries
				}
			}
			if off {
				if st.When != Always {
					return Profile{}, fmt.Errorf("profile %s: step %s is conditional (%s): it cannot be turned off", p.Name, use, st.When)
				}
				st.When = WhenOverridden
			}
			out.Steps[i] = st
		}
	}
	return out, nil
}

// parseOverride reads the definition of a built-in profile's override:
// {"override": {"<step use>": {"args": {…}, "timeout": "90s", "retries": 1}}}.
func parseOverride(name string, def []byte) (Profile, error) {
	var raw struct {
		Override *map[string]struct {
			Args    map[string]string `json:"args"`
			Timeout string            `json:"timeout"`
			Retries *int              `json:"retries"`
		} `json:"override"`
	}
	dec := json.NewDecoder(bytes.NewReader(def))
	dec.DisallowUnknownFields()
	shape := `{"override": {"<step use>": {"args": {…}, "timeout": "90s", "retries": 1}}}`
	if err := dec.Decode(&raw); err != nil {
		return Profile{}, fmt.Errorf("profile %s is built in: it takes only %s (%v); %s", name, shape, err, describeOverridable(name))
	}
	if raw.Override == nil {
		return Profile{}, fmt.Errorf("profile %s is built in: it takes only %s; %s", name, shape, describeOverridable(name))
	}
	o := Override{}
	for use, r := range *raw.Override {
		so := StepOverride{Args: r.Args, Retries: r.Retries}
		if r.Timeout != "" {
			d, err := time.ParseDuration(r.Timeout)
			if err != nil || d < minStepTimeout || d > maxStepTimeout {
				return Profile{}, fmt.Errorf("profile %s: step %s: timeout %q: use a duration between 1s and 48h", name, use, r.Timeout)
			}
			so.Timeout = d
		}
		o[use] = so
	}
	p, _ := builtin(name)
	p, err := ApplyOverride(p, o)
	if err != nil {
		return Profile{}, err
	}
	// The overridden profile must still resolve as the built-in does.
	if _, err := Resolve(p, map[string]string{"image": "x", "wipe": "quick"}); err != nil {
		return Profile{}, err
	}
	return p, nil
}
