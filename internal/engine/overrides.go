package engine

import (
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// conditionUnmet passes over a conditional step whose condition does not hold. A step an
// operator's override of a built-in profile turned off (diag.dcgm level 0) is recorded as
// skipped by override: nothing is skipped silently. The others pass without an event (the
// steps for MAC-less nodes would otherwise add three to every ensureRamdisk).
func (r *run) conditionUnmet(wf *store.Workflow, st workflow.Step) error {
	if st.When == workflow.WhenOverridden {
		return r.stepSkipped(wf, st, "skipped by override of profile "+wf.Profile)
	}
	return r.nextStep(wf)
}

// storedProfile reads the definition of the profile named name stored through the API, when
// the node's state takes one: a deploy profile (deploying), or an override of a built-in
// metal-* profile (any other state; a deploy never runs one). Those take precedence over the
// server's profiles file.
func (r *run) storedProfile(name string) (def string, ok bool, err error) {
	deploying := r.n.State == string(provision.Deploying)
	if deploying == workflow.Overridable(name) {
		return "", false, nil
	}
	return r.tx.Profile(r.ctx, name)
}
