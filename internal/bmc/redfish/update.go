package redfish

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"bcd/internal/bmc"

	"github.com/stmcginnis/gofish/schemas"
)

// Firmware updates through the UpdateService's SimpleUpdate action (DMTF UpdateService schema;
// DSP0266 "Simple updates" and "Asynchronous operations"): the BMC pulls the image from a URL
// and reports its progress in a Task that the driver polls.

var _ bmc.FirmwareUpdater = (*Client)(nil)

// simpleUpdateAction is the "#UpdateService.SimpleUpdate" entry of an UpdateService's Actions.
type simpleUpdateAction struct {
	Target     string   `json:"target"`
	Protocols  []string `json:"TransferProtocol@Redfish.AllowableValues"`
	ActionInfo string   `json:"@Redfish.ActionInfo"`
}

type updateServiceDoc struct {
	ID                string                     `json:"@odata.id"`
	ServiceEnabled    *bool                      `json:"ServiceEnabled"`
	FirmwareInventory odataRef                   `json:"FirmwareInventory"`
	Actions           map[string]json.RawMessage `json:"Actions"`
}

// simpleUpdateName is the key of the action in an UpdateService's Actions.
const simpleUpdateName = "#UpdateService.SimpleUpdate"

// InventoryMember is a FirmwareInventory member, as an update's Targets name it.
type InventoryMember struct {
	URI, ID, Name string
}

// UpdateTargets maps the components of an update (inventory ids, as Firmware reports them) to
// the URIs of the inventory members for SimpleUpdate's Targets: each component is the member
// whose Id, else whose Name, equals it ignoring case (bmc.FindFirmware's rule). A component that
// no member matches but that Firmware derives (BIOS from the system's BiosVersion, BMC from the
// manager's FirmwareVersion) has no member to name: then no Targets are sent at all (nil), and
// the BMC installs the image where the image says, since naming only the other components would
// keep it from the derived one. Any other unmatched component is an error naming what the
// inventory holds. Pure.
func UpdateTargets(inventory []InventoryMember, components []string) ([]string, error) {
	have := make([]bmc.Firmware, len(inventory))
	for i, m := range inventory {
		have[i] = bmc.Firmware{ID: m.ID, Name: m.Name, Version: m.URI}
	}
	var targets, missing []string
	derived := false
	for _, comp := range components {
		f, ok := bmc.FindFirmware(have, comp)
		switch {
		case ok:
			if !slices.Contains(targets, f.Version) {
				targets = append(targets, f.Version)
			}
		case strings.EqualFold(comp, "BIOS") || strings.EqualFold(comp, "BMC"):
			derived = true
		default:
			missing = append(missing, comp)
		}
	}
	if len(missing) > 0 {
		ids := make([]string, 0, len(inventory))
		for _, m := range inventory {
			ids = append(ids, m.ID)
		}
		shown := ids
		if len(shown) == 0 {
			shown = []string{"nothing"}
		}
		if len(shown) > 16 {
			shown = append(slices.Clone(shown[:16]), fmt.Sprintf("… (%d in all)", len(ids)))
		}
		return nil, fmt.Errorf("the BMC's firmware inventory has no component %s (ids are matched, then names, ignoring case; it holds: %s)",
			strings.Join(missing, ", "), strings.Join(shown, ", "))
	}
	if derived {
		return nil, nil
	}
	return targets, nil
}

// TransferProtocol is the SimpleUpdate TransferProtocol for an image URL: HTTP or HTTPS from its
// scheme (any other scheme, or no host, is an error), checked against the protocols the BMC
// allows when it lists any (compared ignoring case). Errors show the URL as bmc.ShownAddress
// does. Pure.
func TransferProtocol(imageURL string, allowed []string) (string, error) {
	u, err := url.Parse(imageURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("image URL %s is not an http:// or https:// URL with a host", bmc.ShownAddress(imageURL))
	}
	proto := strings.ToUpper(u.Scheme)
	if len(allowed) > 0 && !slices.ContainsFunc(allowed, func(a string) bool { return strings.EqualFold(a, proto) }) {
		return "", fmt.Errorf("the BMC's SimpleUpdate does not accept TransferProtocol %s (allowed: %s): serve the image over one of those",
			proto, strings.Join(allowed, ", "))
	}
	return proto, nil
}

// updatePlan is what a SimpleUpdate needs from the BMC.
type updatePlan struct {
	target    string   // the action's URI
	guessed   bool     // the UpdateService lists no Actions: target is the DMTF default
	protocols []string // TransferProtocol@Redfish.AllowableValues (or the ActionInfo's)
	targets   []string // inventory member URIs; nil: none sent
}

// planUpdate reads the UpdateService: its SimpleUpdate action and the inventory members that
// the components name.
func (c *Client) planUpdate(ctx context.Context, components []string) (updatePlan, error) {
	var plan updatePlan
	var root struct {
		UpdateService odataRef `json:"UpdateService"`
	}
	if _, err := c.getJSON(ctx, "/redfish/v1", &root); err != nil {
		return plan, err
	}
	usURI := requestURI(root.UpdateService.ID)
	if usURI == "" {
		return plan, errors.New("the BMC has no UpdateService (the service root links none): its firmware cannot be updated through Redfish")
	}
	var us updateServiceDoc
	if _, err := c.getJSON(ctx, usURI, &us); err != nil {
		return plan, err
	}
	if us.ServiceEnabled != nil && !*us.ServiceEnabled {
		return plan, fmt.Errorf("the BMC's UpdateService %s is disabled (ServiceEnabled false)", usURI)
	}
	raw, listed := us.Actions[simpleUpdateName]
	switch {
	case listed:
		var act simpleUpdateAction
		if err := json.Unmarshal(raw, &act); err != nil {
			return plan, fmt.Errorf("decoding the SimpleUpdate action of %s: %w", usURI, err)
		}
		plan.target = actionTarget(requestURI(act.Target), usURI, "UpdateService.SimpleUpdate")
		plan.protocols = act.Protocols
		if len(plan.protocols) == 0 && act.ActionInfo != "" {
			plan.protocols = c.actionInfoValues(ctx, requestURI(act.ActionInfo), "TransferProtocol")
		}
	case len(us.Actions) > 0:
		return plan, fmt.Errorf("the BMC's UpdateService %s offers no SimpleUpdate action (it lists %s): "+
			"it cannot pull firmware from a URL through Redfish", usURI, strings.Join(slices.Sorted(maps.Keys(us.Actions)), ", "))
	default:
		// No Actions at all: older services leave the property out; the DMTF URI is tried and a
		// refusal there says the action is missing (see startUpdate).
		plan.target = actionTarget("", usURI, "UpdateService.SimpleUpdate")
		plan.guessed = true
	}
	var inventory []InventoryMember
	if us.FirmwareInventory.ID != "" {
		ids, err := c.members(ctx, us.FirmwareInventory.ID)
		if err != nil {
			return plan, err
		}
		if len(ids) > bmc.MaxFirmwareComponents {
			return plan, fmt.Errorf("firmware inventory %s lists %d components: at most %d are read", us.FirmwareInventory.ID, len(ids), bmc.MaxFirmwareComponents)
		}
		for _, id := range ids {
			var f firmwareDoc
			if _, err := c.getJSON(ctx, id, &f); err != nil {
				return plan, err
			}
			if strings.TrimSpace(f.Version) != "" { // as Firmware reports them
				inventory = append(inventory, InventoryMember{URI: id, ID: f.ID, Name: f.Name})
			}
		}
	}
	targets, err := UpdateTargets(inventory, components)
	if err != nil {
		return plan, err
	}
	plan.targets = targets
	return plan, nil
}

// actionInfoValues reads the AllowableValues of one parameter of an @Redfish.ActionInfo; nil
// when it cannot be read or does not list them (logged).
func (c *Client) actionInfoValues(ctx context.Context, uri, param string) []string {
	var info struct {
		Parameters []struct {
			Name            string   `json:"Name"`
			AllowableValues []string `json:"AllowableValues"`
		} `json:"Parameters"`
	}
	if _, err := c.getJSON(ctx, uri, &info); err != nil {
		c.log.WarnContext(ctx, "redfish action info unreadable; assuming no restriction", "action_info", uri, "reason", c.redactor().message(err))
		return nil
	}
	for _, p := range info.Parameters {
		if p.Name == param {
			return p.AllowableValues
		}
	}
	return nil
}

// taskDoc is what the driver reads of a Task (or of a task monitor's answer, or of a Job).
type taskDoc struct {
	ID              string        `json:"@odata.id"`
	TaskState       string        `json:"TaskState"`
	TaskStatus      string        `json:"TaskStatus"`
	JobState        string        `json:"JobState"`  // a Job (DMTF JobService, Dell's DellJob)
	JobStatus       string        `json:"JobStatus"` // a DMTF Job
	Message         string        `json:"Message"`   // a DellJob
	PercentComplete *int          `json:"PercentComplete"`
	TaskMonitor     string        `json:"TaskMonitor"`
	Messages        []taskMessage `json:"Messages"`
	Oem             struct {
		Dell struct {
			JobState string `json:"JobState"`
			Message  string `json:"Message"`
		} `json:"Dell"`
	} `json:"Oem"`
}

type taskMessage struct {
	MessageID string `json:"MessageId"`
	Message   string `json:"Message"`
}

// isTask reports whether the document describes a task or job at all.
func (t taskDoc) isTask() bool {
	return t.TaskState != "" || t.JobState != "" || t.Oem.Dell.JobState != ""
}

// state is the task's state: TaskState, else JobState (a Job), else Dell's JobState.
func (t taskDoc) state() string {
	return cmp.Or(t.TaskState, t.JobState, t.Oem.Dell.JobState)
}

// messages is the task's messages as one line: "text (id); …".
func (t taskDoc) messages() string {
	var parts []string
	for _, m := range t.Messages {
		if m.Message != "" || m.MessageID != "" {
			parts = append(parts, fmt.Sprintf("%s (%s)", m.Message, m.MessageID))
		}
	}
	for _, m := range []string{t.Message, t.Oem.Dell.Message} {
		if m != "" && !slices.ContainsFunc(t.Messages, func(x taskMessage) bool { return x.Message == m }) {
			parts = append(parts, m)
		}
	}
	return strings.Join(parts, "; ")
}

// Task outcomes (taskOutcome).
const (
	taskRunning = "running" // not ended: poll again
	taskDone    = "done"    // ended in success
	taskStaged  = "staged"  // scheduled to run at the host's next reset (Dell's "Scheduled" job): success
	taskFailed  = "failed"  // ended in failure
)

// taskOutcome decides what a Task (or Job) document says of an update: Completed with a
// TaskStatus of OK, Warning or none is done (Critical is a failure); Exception, Killed,
// Cancelled and Interrupted are failures; any other state is still running, except that a job
// that iDRAC reports as Scheduled (Oem.Dell.JobState, or a DellJob's JobState) is staged for the
// host's next reset, which is as far as the update goes before that reset. A DellJob's Failed
// and CompletedWithErrors are failures. Pure.
func taskOutcome(t taskDoc) string {
	switch t.TaskState {
	case "Completed":
		if strings.EqualFold(t.TaskStatus, "Critical") {
			return taskFailed
		}
		return taskDone
	case "Exception", "Killed", "Cancelled", "Interrupted":
		return taskFailed
	}
	switch dell := cmp.Or(t.Oem.Dell.JobState, t.JobState); dell {
	case "Scheduled":
		return taskStaged
	case "Failed", "CompletedWithErrors", "Exception", "Cancelled", "Killed", "Interrupted":
		return taskFailed
	case "Completed":
		if t.TaskState == "" { // a Job read in place of the task
			if strings.EqualFold(t.JobStatus, "Critical") {
				return taskFailed
			}
			return taskDone
		}
	}
	return taskRunning
}

// UpdateFirmware has the BMC pull the image at imageURL (http or https) and install it on
// components (firmware inventory ids, as Firmware reports them), then follows the update's task
// until it ends (ctx bounds the wait); see docs/drivers/redfish.md, "Firmware updates".
// Errors and logs show imageURL as bmc.ShownAddress does.
func (c *Client) UpdateFirmware(ctx context.Context, imageURL string, components []string, progress func(percent int)) error {
	what := "updating firmware from " + bmc.ShownAddress(imageURL)
	fail := func(err error) error { return fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err) }
	if len(components) == 0 {
		return fail(errors.New("no component named: name the firmware inventory ids the image is for"))
	}
	if len(components) > bmc.MaxFirmwareComponents {
		return fail(fmt.Errorf("%d components named: at most %d are accepted", len(components), bmc.MaxFirmwareComponents))
	}
	if slices.Contains(components, "") {
		return fail(errors.New("a component name is empty"))
	}
	if _, err := TransferProtocol(imageURL, nil); err != nil {
		return fail(err)
	}
	hide := hideURL(imageURL)
	var plan updatePlan
	if err := c.retry(ctx, what+": reading the UpdateService", func(ctx context.Context) (err error) {
		plan, err = c.planUpdate(ctx, components)
		return err
	}, hide); err != nil {
		return err
	}
	proto, err := TransferProtocol(imageURL, plan.protocols)
	if err != nil {
		return fail(err)
	}
	if plan.targets == nil {
		c.log.InfoContext(ctx, "redfish firmware update names a component with no inventory member; sending no Targets (the BMC installs the image where it applies)",
			"components", components)
	}
	start, err := c.startUpdate(ctx, what, plan, imageURL, proto, hide)
	if err != nil {
		return err
	}
	if start.monitor == "" {
		c.log.InfoContext(ctx, "redfish firmware update accepted with no task to follow; taken as done", "status", start.status,
			"components", components)
		return nil
	}
	c.log.InfoContext(ctx, "redfish firmware update started", "task", start.monitor, "components", components, "targets", plan.targets)
	return c.followTask(ctx, what, start, progress, hide)
}

// updateStart is the BMC's answer to the SimpleUpdate POST.
type updateStart struct {
	status  int
	monitor string   // what to poll: the Location, else the body's TaskMonitor, else its @odata.id
	task    string   // the Task resource's URI when known (may equal monitor)
	first   *taskDoc // the Task in the answer's body, if any
}

// startUpdate POSTs the SimpleUpdate: ImageURI, TransferProtocol (the URL's scheme), Targets
// when plan has them. A BMC that lists no allowed protocols and refuses the request as not
// supported gets it once more without TransferProtocol (DMTF: a scheme in ImageURI makes it
// redundant); one still refusing it with Targets gets it without them (iDRAC does not support
// Targets: the image names its component). With no Actions listed, a refusal of the DMTF
// default target means the action is missing.
func (c *Client) startUpdate(ctx context.Context, what string, plan updatePlan, imageURL, proto string, hide hidden) (updateStart, error) {
	body := map[string]any{"ImageURI": imageURL, "TransferProtocol": proto}
	if plan.targets != nil {
		body["Targets"] = plan.targets
	}
	var st updateStart
	post := func(ctx context.Context) (err error) {
		st, err = c.postAction(ctx, plan.target, body)
		return err
	}
	err := c.retry(ctx, what+": UpdateService.SimpleUpdate", post, hide)
	if err != nil && len(plan.protocols) == 0 && refusedParameter(err) {
		c.log.WarnContext(ctx, "redfish SimpleUpdate refused with TransferProtocol; sending it without (the URL's scheme names the protocol)",
			"reason", c.redactor(hide).message(err))
		delete(body, "TransferProtocol")
		err = c.retry(ctx, what+": UpdateService.SimpleUpdate without TransferProtocol", post, hide)
	}
	if err != nil && plan.targets != nil && refusedParameter(err) {
		c.log.WarnContext(ctx, "redfish SimpleUpdate refused with Targets; sending it without (the BMC installs the image where it applies)",
			"targets", plan.targets, "reason", c.redactor(hide).message(err))
		delete(body, "Targets")
		err = c.retry(ctx, what+": UpdateService.SimpleUpdate without Targets", post, hide)
	}
	if err != nil && plan.guessed && (isStatus(err, http.StatusNotFound) || NotSupported(err)) {
		return st, fmt.Errorf("%s on Redfish BMC %s: the BMC's UpdateService lists no Actions and refuses SimpleUpdate at its DMTF URI %s (%s): "+
			"it cannot pull firmware from a URL through Redfish", what, c.base, plan.target, c.redactor(hide).message(err))
	}
	return st, err
}

// refusedParameter reports whether err refuses an action's parameter (or the action as sent).
func refusedParameter(err error) bool {
	if NotSupported(err) {
		return true
	}
	var re *schemas.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, id := range messageIDs(re) {
		if slices.Contains([]string{"ActionParameterUnknown", "ActionParameterValueConflict", "PropertyUnknown"}, id) {
			return true
		}
	}
	return false
}

// maxTaskBody bounds the body of an action's answer or a task the driver reads.
const maxTaskBody = 1 << 20

// postAction POSTs an action and returns where its task is, if anywhere.
func (c *Client) postAction(ctx context.Context, uri string, body any) (updateStart, error) {
	var st updateStart
	api, err := c.apiCtx(ctx)
	if err != nil {
		return st, err
	}
	resp, err := api.PostWithHeaders(uri, body, nil)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxTaskBody))
	if err != nil {
		return st, fmt.Errorf("reading the answer to POST %s: %w", uri, err)
	}
	st.status = resp.StatusCode
	st.monitor = requestURI(resp.Header.Get("Location"))
	var t taskDoc
	if len(bytes.TrimSpace(b)) > 0 && json.Unmarshal(b, &t) == nil && t.isTask() {
		st.first = &t
		st.task = requestURI(t.ID)
		if st.monitor == "" {
			st.monitor = cmp.Or(requestURI(t.TaskMonitor), st.task)
		}
	}
	return st, nil
}

// followTask polls the update's task every PollInterval until it ends or ctx does, telling
// progress each new PercentComplete. A task that disappears (404) is looked for at the Task's
// own URI, then as a Job (iDRAC deletes finished tasks within seconds but keeps the job under
// /redfish/v1/JobService/Jobs); found nowhere, the outcome is unknown: an error. Reads that fail
// otherwise (the BMC restarting into new firmware, busy) are retried until ctx ends; an expired
// session (401) is logged in again.
func (c *Client) followTask(ctx context.Context, what string, st updateStart, progress func(int), hide hidden) error {
	red := c.redactor(hide)
	last := -1
	state := "Accepted"
	report := func(t taskDoc) {
		state = cmp.Or(t.state(), state)
		if t.PercentComplete != nil && progress != nil {
			p := min(max(*t.PercentComplete, 0), 100)
			if p != last {
				last = p
				progress(p)
			}
		}
	}
	verdict := func(t taskDoc, uri string) (bool, error) {
		switch taskOutcome(t) {
		case taskDone:
			c.log.InfoContext(ctx, "redfish firmware update task completed", "task", uri, "status", t.TaskStatus)
			return true, nil
		case taskStaged:
			c.log.InfoContext(ctx, "redfish firmware update scheduled for the host's next reset", "task", uri)
			return true, nil
		case taskFailed:
			msg := red.text(clipMessage(t.messages()))
			if msg == "" {
				msg = "no message"
			}
			return true, &Error{Op: what, BMC: c.base, Message: fmt.Sprintf("the update task %s ended %s (status %s): %s",
				uri, t.state(), cmp.Or(t.TaskStatus, t.JobStatus, "none"), msg)}
		}
		return false, nil
	}
	if st.first != nil {
		report(*st.first)
		if done, err := verdict(*st.first, st.monitor); done {
			return err
		}
	}
	fallbacks := taskFallbacks(st)
	monitor := st.monitor
	var lastErr error
	for {
		t := time.NewTimer(c.opts.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			why := ""
			if lastErr != nil {
				why = "; the last read failed: " + red.message(lastErr)
			}
			pct := "unknown"
			if last >= 0 {
				pct = fmt.Sprintf("%d%%", last)
			}
			return fmt.Errorf("%s on Redfish BMC %s: waiting for the update task %s: still %s at %s when the wait ended%s: %w",
				what, c.base, monitor, state, pct, why, ctx.Err())
		case <-t.C:
		}
		status, doc, err := c.readTask(ctx, monitor)
		switch {
		case err == nil && doc.isTask():
			lastErr = nil
			report(doc)
			if done, err := verdict(doc, monitor); done {
				return err
			}
		case err == nil && status == http.StatusAccepted:
			lastErr = nil // a task monitor: still running
		case err == nil:
			// A task monitor's final answer: the operation's own success (DSP0266).
			c.log.InfoContext(ctx, "redfish firmware update task monitor answered the operation's result", "task", monitor, "status", status)
			return nil
		case isStatus(err, http.StatusNotFound):
			if len(fallbacks) == 0 {
				return &Error{Op: what, BMC: c.base, Message: fmt.Sprintf("the BMC removed the update task %s before reporting how it ended "+
					"(last seen %s): the outcome is unknown; read the firmware versions to know", monitor, state)}
			}
			c.log.InfoContext(ctx, "redfish firmware update task gone; looking for it elsewhere", "task", monitor, "next", fallbacks[0])
			monitor, fallbacks = fallbacks[0], fallbacks[1:]
		case isStatus(err, http.StatusUnauthorized):
			lastErr = err
			c.log.InfoContext(ctx, "redfish session lost while following a firmware update (the BMC may have restarted); logging in again")
			if lerr := c.relogin(ctx); lerr != nil {
				lastErr = lerr
			}
		case isRedfishError(err) && !Transient(err) && !isStatus(err, http.StatusBadGateway) && !isStatus(err, http.StatusGatewayTimeout) &&
			!isStatus(err, http.StatusInternalServerError):
			// A task monitor's final answer: the operation's own failure (DSP0266).
			return &Error{Op: what, BMC: c.base, Message: "the update task " + monitor + " ended in failure: " + red.message(err),
				err: red.cause(err)}
		default:
			lastErr = err
			c.log.DebugContext(ctx, "redfish firmware update task unreadable; polling on", "task", monitor, "reason", red.message(err))
		}
	}
}

// taskFallbacks are where to look for a task whose monitor went away: the Task resource (when
// it is not the monitor), then the job of the same id (iDRAC: /redfish/v1/JobService/Jobs/JID_…).
func taskFallbacks(st updateStart) []string {
	var out []string
	if st.task != "" && !sameURI(st.task, st.monitor) {
		out = append(out, st.task)
	}
	for _, uri := range []string{st.task, st.monitor} {
		i := strings.LastIndex(strings.TrimSuffix(uri, "/"), "/TaskService/Tasks/")
		if i < 0 {
			continue
		}
		id := strings.TrimSuffix(uri, "/")[i+len("/TaskService/Tasks/"):]
		if id == "" || strings.Contains(id, "/") {
			continue
		}
		job := "/redfish/v1/JobService/Jobs/" + id
		if !slices.Contains(out, job) {
			out = append(out, job)
		}
	}
	return out
}

// readTask GETs a task or task monitor: its status and, when the body is one, the task.
func (c *Client) readTask(ctx context.Context, uri string) (int, taskDoc, error) {
	var t taskDoc
	api, err := c.apiCtx(ctx)
	if err != nil {
		return 0, t, err
	}
	resp, err := api.Get(uri)
	if err != nil {
		return 0, t, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxTaskBody))
	if err != nil {
		return resp.StatusCode, t, fmt.Errorf("reading %s: %w", uri, err)
	}
	if len(bytes.TrimSpace(b)) > 0 {
		_ = json.Unmarshal(b, &t) // a monitor's final answer may be any body
	}
	return resp.StatusCode, t, nil
}

// relogin replaces the client's session with a new one (after the BMC dropped it).
func (c *Client) relogin(ctx context.Context) error {
	c.mu.Lock()
	password := c.ep.Password
	c.mu.Unlock()
	api, err := c.connect(ctx, password)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.api == nil { // closed meanwhile
		c.mu.Unlock()
		api.WithContext(ctx).Logout()
		return errors.New("client is closed")
	}
	c.api = api
	c.mu.Unlock()
	return nil
}
