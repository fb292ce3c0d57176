package webui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/workflow"
)

// verbSpec is one verb the node page offers: the verb, its button, whether it needs the
// "I understand" confirmation (it erases, overwrites, stops work or cuts power), and what the
// page says once the service accepted it.
type verbSpec struct {
	Verb        provision.Verb
	Label       string
	Destructive bool
	Done        string
}

// nodeVerbs is the table of the node page's verb forms, in the page's order. Delete and
// enroll have their own calls and are not offered. Pure.
func nodeVerbs() []verbSpec {
	return []verbSpec{
		{provision.VerbManage, "Manage", false, "Manage accepted: the node is manageable."},
		{provision.VerbInspect, "Inspect", false, "Inspect accepted: the node is being inspected."},
		{provision.VerbProvide, "Provide", false, "Provide accepted: the node is being commissioned toward ready."},
		{provision.VerbDeploy, "Deploy", true, "Deploy accepted: the node is deploying."},
		{provision.VerbUndeploy, "Undeploy", true, "Undeploy accepted: the node is being released (wiped) toward ready."},
		{provision.VerbRescue, "Rescue", false, "Rescue accepted: the node is booting the rescue ramdisk."},
		{provision.VerbUnrescue, "Unrescue", false, "Unrescue accepted: the node returns to deployed."},
		{provision.VerbRetire, "Retire", true, "Retire accepted: the node is retiring."},
		// Recover of a failed deploy releases (wipes) the node first: it needs confirmation.
		{provision.VerbRecover, "Recover", true, "Recover accepted: the node's fault is cleared and its workflow runs again (a failed deploy is released, its disks wiped, first)."},
		{provision.VerbAbort, "Abort", true, "Abort accepted: the node's workflow is stopped; the node is failed and in maintenance."},
		{provision.VerbMaintenance, "Maintenance", false, ""},
		{provision.VerbPower, "Power", true, "The power command was queued."},
	}
}

// verbSpecOf is the spec of the verb in a URL; false for any other. Pure.
func verbSpecOf(verb string) (verbSpec, bool) {
	for _, v := range nodeVerbs() {
		if string(v.Verb) == verb {
			return v, true
		}
	}
	return verbSpec{}, false
}

// offeredVerbs lists the verbs of the node page's forms: those of the table the node accepts
// now (allowed: provision.Accepted, as the API's allowed_verbs). Pure.
func offeredVerbs(allowed []string) []verbSpec {
	var out []verbSpec
	for _, v := range nodeVerbs() {
		if slices.Contains(allowed, string(v.Verb)) {
			out = append(out, v)
		}
	}
	return out
}

// The node page's done codes beyond the verbs' own (a verb's code is its name).
const (
	doneMaintenanceOn  = "maintenance-on"
	doneMaintenanceOff = "maintenance-off"
	donePowerHeld      = "power-held"
)

// verbMessage is the node page's message after a verb, by the code in its URL (never text from
// the URL). Pure.
func verbMessage(code string) string {
	switch code {
	case doneMaintenanceOn:
		return "Maintenance is on."
	case doneMaintenanceOff:
		return "Maintenance is off: work it held resumes."
	case donePowerHeld:
		return "The power command waits for approval: this installation requires approvals for it (batch below)."
	case string(provision.VerbMaintenance):
		return ""
	}
	if v, ok := verbSpecOf(code); ok {
		msg := v.Done
		if v.Verb != provision.VerbPower && v.Destructive {
			msg += " Where this installation requires approvals, its destructive steps wait for the node's batch (shown under batch once the reconciler made it)."
		}
		return msg
	}
	return ""
}

// verbInput reads a verb form into the service's input: the node, the version the page showed
// (required: a page must not act on a node that changed since it was read), the reason and the
// verb's own fields. A destructive verb needs its confirmation box checked. The values of the
// verb's own fields are the service's to check. Pure.
func verbInput(spec verbSpec, ref string, form url.Values) (metal.VerbInput, error) {
	in := metal.VerbInput{Node: ref, Reason: strings.TrimSpace(form.Get("reason"))}
	ver := form.Get("version")
	n, err := strconv.ParseUint(ver, 10, 64)
	if err != nil || n == 0 {
		return in, fmt.Errorf("version %q: the form must carry the node version its page showed (a whole number from 1); reload the node's page and submit again", truncate(ver, 20))
	}
	in.ExpectedVersion = n
	if spec.Destructive && form.Get("confirm") != "yes" {
		return in, fmt.Errorf("%s needs confirmation: check \"I understand\" and submit again; nothing was changed", spec.Verb)
	}
	switch spec.Verb {
	case provision.VerbDeploy:
		in.Image, in.Profile = form.Get("image"), form.Get("profile")
		// A browser sends a textarea's lines ended with CRLF: a script's "#!/bin/sh\r" would not
		// run, so they are given back their LF. The service checks the rest.
		if ud := strings.ReplaceAll(form.Get("user_data"), "\r\n", "\n"); strings.TrimSpace(ud) != "" {
			in.UserData = []byte(ud)
		}
	case provision.VerbUndeploy:
		in.Wipe = form.Get("wipe")
	case provision.VerbPower:
		in.PowerAction = form.Get("action")
	case provision.VerbMaintenance:
		switch form.Get("on") {
		case "true":
			in.MaintenanceOn = true
		case "false":
		default:
			return in, fmt.Errorf("on %q: accepted are true (turn maintenance on) or false (turn it off)", truncate(form.Get("on"), 20))
		}
	}
	return in, nil
}

// deployProfileNames lists the deploy profiles a deploy may name, as the service knows them:
// the built-in "default" and the stored ones that are not overrides of a metal-* profile.
// Pure.
func deployProfileNames(stored map[string]string) []string {
	out := []string{"default"}
	for name := range stored {
		if !workflow.Overridable(name) && name != "default" {
			out = append(out, name)
		}
	}
	slices.Sort(out[1:])
	return out
}

// nodeVerb runs a verb form's verb on a node through the service, as the API's handler of the
// verb does (metal.Service.Apply with the session's principal), then sends the browser back to
// the node's page with a done code, or shows the node's page with the service's error.
func (u *UI) nodeVerb(w http.ResponseWriter, r *http.Request, s session) {
	ref := r.PathValue("ref")
	spec, ok := verbSpecOf(r.PathValue("verb"))
	if !ok {
		var names []string
		for _, v := range nodeVerbs() {
			names = append(names, string(v.Verb))
		}
		u.fail(w, r, &s, http.StatusNotFound, fmt.Sprintf("unknown verb %q on a node: accepted are %s", truncate(r.PathValue("verb"), 32), strings.Join(names, ", ")))
		return
	}
	// The service's own first check (Apply makes it too): a token that may not operate is
	// refused with the service's words before anything of the form is judged.
	if err := metal.Require(s.p, auth.Operate); err != nil {
		u.nodeFailed(w, r, s, ref, err)
		return
	}
	in, err := verbInput(spec, ref, r.PostForm)
	if err != nil {
		u.nodeRefused(w, r, s, ref, http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	n, cmdID, err := u.svc.Apply(ctx, s.p, spec.Verb, in)
	if err != nil {
		u.nodeFailed(w, r, s, ref, err)
		return
	}
	target := "/ui/nodes/" + url.PathEscape(n.ID) + "?done="
	switch {
	case spec.Verb == provision.VerbMaintenance && in.MaintenanceOn:
		target += doneMaintenanceOn
	case spec.Verb == provision.VerbMaintenance:
		target += doneMaintenanceOff
	case spec.Verb == provision.VerbPower:
		// The command is the node's (Apply queued it): where approvals are required it is
		// held on a one-node batch.
		c, err := u.svc.Store().Command(ctx, cmdID)
		if err != nil {
			u.serviceError(w, r, &s, fmt.Errorf("reading the queued power command %s: %w", cmdID, err))
			return
		}
		if c.BatchID != "" {
			target += donePowerHeld + "&batch=" + url.QueryEscape(c.BatchID)
		} else {
			target += string(spec.Verb)
		}
	default:
		target += string(spec.Verb)
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// nodeFailed shows the node's page with a service error in the API's words (internal errors
// logged, not shown), or the error page when the node cannot be shown.
func (u *UI) nodeFailed(w http.ResponseWriter, r *http.Request, s session, ref string, err error) {
	status, msg, internal := apiError(err)
	if internal {
		u.log.ErrorContext(r.Context(), "web UI request failed", "path", r.URL.Path, "error", err)
	}
	u.nodeRefused(w, r, s, ref, status, msg)
}

// nodeRefused shows the node's page, read again, with msg and status; where the node cannot be
// read (not the caller's, gone) the error page says why.
func (u *UI) nodeRefused(w http.ResponseWriter, r *http.Request, s session, ref string, status int, msg string) {
	v, err := u.loadNode(r.Context(), s, ref)
	if err != nil {
		u.fail(w, r, &s, status, msg)
		return
	}
	v.Error = msg
	u.render(w, r, status, nodePage(s, v))
}

// loadVerbChoices fills the deploy form's choices: the catalog's deployable images (by name
// only: an image's URL may hold credentials) and the deploy profiles.
func (u *UI) loadVerbChoices(ctx context.Context, p auth.Principal, v *nodeView) error {
	imgs, verdicts, err := u.svc.Images(ctx, p)
	if err != nil {
		return err
	}
	for i, img := range imgs {
		if verdicts[i] == "" {
			v.Images = append(v.Images, img.Name)
		} else {
			v.Undeployable++
		}
	}
	profiles, err := u.svc.DeployProfiles(ctx, p)
	if err != nil {
		return err
	}
	v.Profiles = deployProfileNames(profiles)
	return nil
}

// wipeModes are the undeploy form's wipe modes, the service's.
func wipeModes() []string { return metal.WipeModes }

// powerActions are the power form's actions.
func powerActions() []string { return []string{"on", "off", "cycle"} }
