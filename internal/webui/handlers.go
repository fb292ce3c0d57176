package webui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"bcd/internal/auth"
	"bcd/internal/hardware"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/readable"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// ---------------------------------------------------------------- login

func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) {
	u.render(w, r, http.StatusOK, loginPage(loginMessage(r.URL.Query().Get("m")), ""))
}

// login checks the token with the service, as the API's authentication does, and keeps it in
// the session cookie. The token is never written back: not in the page, not in an error.
func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if msg := checkOrigin(r); msg != "" {
		u.render(w, r, http.StatusForbidden, loginPage("", msg))
		return
	}
	tok, err := auth.ParseBearer("Bearer " + r.PostFormValue("token"))
	if err != nil {
		u.render(w, r, http.StatusUnauthorized, loginPage("", "Not a bcd API token: bcd tokens start with \""+auth.TokenPrefix+"\" (bcd token create prints one)."))
		return
	}
	p, err := u.svc.Authenticate(r.Context(), tok)
	if err != nil {
		status, msg := http.StatusUnauthorized, "Unknown or revoked token."
		if _, _, internal := apiError(err); internal {
			u.log.ErrorContext(r.Context(), "web UI: checking a token at login", "error", err)
			status, msg = http.StatusServiceUnavailable, "Checking the token failed; try again."
		}
		u.render(w, r, status, loginPage("", msg))
		return
	}
	u.setCookie(w, tok)
	u.log.InfoContext(r.Context(), "web UI login", "token_name", p.Name, "role", string(p.Role))
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request, s session) {
	u.clearCookie(w)
	http.Redirect(w, r, "/ui/login?m="+msgLoggedOut, http.StatusSeeOther)
}

// ---------------------------------------------------------------- names

// names resolves the tenant, site and pool ids the caller may see.
type names struct{ tenants, sites, pools map[string]string }

func (u *UI) names(ctx context.Context, p auth.Principal) (names, []store.Site, []store.Pool, error) {
	nm := names{tenants: map[string]string{}, sites: map[string]string{}, pools: map[string]string{}}
	tenants, err := u.svc.Tenants(ctx, p)
	if err != nil {
		return nm, nil, nil, err
	}
	for _, t := range tenants {
		nm.tenants[t.ID] = t.Name
	}
	sites, err := u.svc.Sites(ctx, p, "")
	if err != nil {
		return nm, nil, nil, err
	}
	for _, s := range sites {
		nm.sites[s.ID] = s.Name
	}
	pools, err := u.svc.Pools(ctx, p, "", "")
	if err != nil {
		return nm, nil, nil, err
	}
	for _, pl := range pools {
		nm.pools[pl.ID] = pl.Name
	}
	return nm, sites, pools, nil
}

// ---------------------------------------------------------------- dashboard

type stateCount struct {
	State string
	N     int
}

type dashboardView struct {
	Counts      []stateCount
	Total       int
	Maintenance int          // nodes in maintenance the caller sees (its tenant's, or all)
	Failed      []store.Node // failed or faulted, in maintenance (doctor), the first failedShown
	Stranded    int
	Pending     []store.Batch
	Agents      int
	Online      int
	// Waiting are the commands waiting for the visible sites' agents to take them (doctor's
	// queues), site agents' and ramdisks' apart; WaitingSince when the oldest of the site
	// agents' was queued (micros, 0: none).
	WaitingSite, WaitingRamdisk int
	WaitingSince                int64
}

// failedShown is how many failed nodes the dashboard lists.
const failedShown = 20

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request, s session) {
	v, err := u.loadDashboard(r.Context(), s.p)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	u.render(w, r, http.StatusOK, dashboardPage(s, v))
}

func (u *UI) loadDashboard(ctx context.Context, p auth.Principal) (dashboardView, error) {
	var v dashboardView
	if err := metal.Require(p, auth.Read); err != nil {
		return v, err
	}
	st := u.svc.Store()
	counts, err := st.CountByState(ctx)
	if p.TenantID != "" {
		counts, err = st.CountByStateOfTenant(ctx, p.TenantID)
	}
	if err != nil {
		return v, err
	}
	for _, state := range provision.States() {
		c := stateCount{State: string(state), N: counts[string(state)]}
		v.Counts = append(v.Counts, c)
		v.Total += c.N
	}
	if v.Maintenance, err = st.CountInMaintenance(ctx, p.TenantID); err != nil {
		return v, err
	}
	if v.Failed, err = st.FailedInMaintenance(ctx, p.TenantID, failedShown); err != nil {
		return v, err
	}
	if v.Stranded, err = st.CountStranded(ctx, p.TenantID); err != nil {
		return v, err
	}
	if v.Pending, err = u.svc.PendingBatches(ctx, p, 100); err != nil {
		return v, err
	}
	sites, err := u.svc.Sites(ctx, p, "")
	if err != nil {
		return v, err
	}
	visible := map[string]bool{}
	for _, s := range sites {
		visible[s.ID] = true
	}
	agents, err := st.SiteAgents(ctx)
	if err != nil {
		return v, err
	}
	for _, a := range agents {
		if visible[a.SiteID] {
			v.Agents++
			if a.Connected {
				v.Online++
			}
		}
	}
	depths, err := st.QueueDepths(ctx)
	if err != nil {
		return v, err
	}
	for _, d := range depths {
		switch {
		case !visible[d.SiteID]:
		case d.RunsOn == "site":
			v.WaitingSite += d.Commands
			if v.WaitingSince == 0 || d.Oldest < v.WaitingSince {
				v.WaitingSince = d.Oldest
			}
		default:
			v.WaitingRamdisk += d.Commands
		}
	}
	return v, nil
}

// ---------------------------------------------------------------- nodes

// Page sizes of the node list.
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// parsePageSize reads the page_size parameter. Pure.
func parsePageSize(s string) (int, error) {
	if s == "" {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxPageSize {
		return 0, fmt.Errorf("page_size %q: accepted are whole numbers from 1 to %d (default %d)", truncate(s, 20), maxPageSize, defaultPageSize)
	}
	return n, nil
}

type nodeListView struct {
	Filter   metal.ListInput
	Nodes    []store.Node
	Names    names
	Sites    []store.Site
	Pools    []store.Pool
	States   []string
	NextURL  string // "" on the last page
	FirstURL string // "" on the first page
}

// splitRequirements reads the node list's hardware filter: requirements separated by commas
// ("gpus>=1, memory>=256GiB"). Pure.
func splitRequirements(s string) []string {
	var out []string
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

func (u *UI) nodeList(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	size, err := parsePageSize(q.Get("page_size"))
	if err != nil {
		u.fail(w, r, &s, http.StatusBadRequest, err.Error())
		return
	}
	in := metal.ListInput{State: q.Get("state"), Pool: q.Get("pool"), Site: q.Get("site"), Maintenance: q.Get("maintenance"),
		Require: splitRequirements(q.Get("require")), PageSize: size, PageToken: q.Get("page")}
	ctx := r.Context()
	list, next, err := u.svc.List(ctx, s.p, in)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	nm, sites, pools, err := u.names(ctx, s.p)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	v := nodeListView{Filter: in, Nodes: list, Names: nm, Sites: sites, Pools: pools}
	for _, st := range provision.States() {
		v.States = append(v.States, string(st))
	}
	if next != "" {
		q.Set("page", next)
		v.NextURL = "/ui/nodes?" + q.Encode()
	}
	if in.PageToken != "" {
		q.Del("page")
		v.FirstURL = "/ui/nodes?" + q.Encode()
	}
	u.render(w, r, http.StatusOK, nodesPage(s, v))
}

type stepView struct {
	Name, Status string
}

type workflowView struct {
	store.Workflow
	StepList, CleanupList []stepView
	Commands              []commandView // what it sent, oldest first
}

// commandView is a command of a workflow as its node's page lists it.
type commandView struct {
	store.Command
	Waited, Ran string // queued → acknowledged, acknowledged → ended ("" when not yet or never)
}

// commandViews are a workflow's commands (newest first, as the service lists them) oldest
// first, with how long each waited for an agent and ran. Pure.
func commandViews(cmds []metal.NodeCommand) []commandView {
	out := make([]commandView, 0, len(cmds))
	for _, c := range slices.Backward(cmds) {
		out = append(out, commandView{Command: c.Command, Waited: took(c.CreatedAt, c.DeliveredAt), Ran: took(c.DeliveredAt, c.FinishedAt)})
	}
	return out
}

// took is the time between two store times (microseconds), rounded for reading; "" when
// either is not set. Pure.
func took(from, to int64) string {
	if from == 0 || to == 0 || to < from {
		return ""
	}
	return readable.Duration(time.Duration(to-from) * time.Microsecond)
}

type attestationView struct {
	store.Command
	Verified    bool
	VerifyError string
}

type nodeView struct {
	N            store.Node
	Names        names
	Activity     metal.Activity
	Workflow     *workflowView
	Events       []store.Event
	Attestations []attestationView
	// Hardware describes the node's inventory as its ramdisk last reported it (reported at
	// HardwareAt); none before it was inspected.
	Hardware   []hardware.Line
	HardwareAt int64
	Allowed    []string
	// The verb forms: shown to a token that may operate (the service's own check), for the
	// verbs the node accepts now.
	CanOperate bool
	Offered    []verbSpec
	// Console: the page links the node's console (an operator, a server that relays them).
	Console      bool
	Images       []string // the deploy form's deployable catalog images
	Undeployable int      // catalog images whose signature does not verify
	Profiles     []string // the deploy form's deploy profiles
	Message      string   // after a verb, by its done code
	HeldBatch    *store.Batch
	Error        string // a refused verb, in the API's words
}

// nodeEvents is how many of a node's events its page shows, nodeCommands how many of its
// latest workflow's commands.
const nodeEvents, nodeCommands = 25, 100

func (u *UI) nodeDetail(w http.ResponseWriter, r *http.Request, s session) {
	v, err := u.loadNode(r.Context(), s, r.PathValue("ref"))
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	q := r.URL.Query()
	v.Message = verbMessage(q.Get("done"))
	if q.Get("done") == donePowerHeld && q.Get("batch") != "" {
		// Shown as the service reads it for the caller: nothing of the URL is rendered.
		if b, _, err := u.svc.Batch(r.Context(), s.p, q.Get("batch"), 1); err == nil {
			v.HeldBatch = &b
		}
	}
	u.render(w, r, http.StatusOK, nodePage(s, v))
}

// loadNode reads what the node page shows of node ref, as the caller.
func (u *UI) loadNode(ctx context.Context, s session, ref string) (nodeView, error) {
	n, err := u.svc.Get(ctx, s.p, ref)
	if err != nil {
		return nodeView{}, err
	}
	v := nodeView{N: n}
	for _, verb := range provision.Accepted(metal.PNode(n)) {
		v.Allowed = append(v.Allowed, string(verb))
	}
	if v.CanOperate = metal.Require(s.p, auth.Operate) == nil; v.CanOperate {
		v.Console = u.consoles != nil
		v.Offered = offeredVerbs(v.Allowed)
		if slices.Contains(v.Allowed, string(provision.VerbDeploy)) {
			if err := u.loadVerbChoices(ctx, s.p, &v); err != nil {
				return v, err
			}
		}
	}
	if v.Names, _, _, err = u.names(ctx, s.p); err != nil {
		return v, err
	}
	if v.Activity, err = u.svc.Activity(ctx, s.p, n); err != nil {
		return v, err
	}
	// The node is the caller's (Get said so): its latest workflow, as Activity reads it.
	wfs, err := u.svc.Store().Workflows(ctx, n.ID, 1)
	if err != nil {
		return v, err
	}
	if len(wfs) == 1 {
		v.Workflow = workflowSteps(wfs[0])
		cmds, err := u.svc.Commands(ctx, s.p, n.ID, wfs[0].ID, nodeCommands)
		if err != nil {
			return v, err
		}
		v.Workflow.Commands = commandViews(cmds)
	}
	v.Events, err = u.newestEvents(ctx, s.p, metal.EventQuery{Node: n.ID, Limit: nodeEvents})
	if err != nil {
		return v, err
	}
	switch inv, err := u.svc.Inventory(ctx, s.p, n.ID); {
	case err == nil:
		v.Hardware, v.HardwareAt = hardware.Describe(inv.Facts), inv.UpdatedAt
	case !errors.Is(err, store.ErrNotFound):
		return v, err
	}
	cmds, err := u.svc.Attestations(ctx, s.p, n.ID, "", 20)
	if err != nil {
		return v, err
	}
	for _, c := range cmds {
		a := attestationView{Command: c}
		switch {
		case u.verifier == nil:
			a.VerifyError = "this server has no agent CA to check it against"
		default:
			if err := u.verifier.VerifyRecorded(c); err != nil {
				a.VerifyError = err.Error()
			} else {
				a.Verified = true
			}
		}
		v.Attestations = append(v.Attestations, a)
	}
	return v, nil
}

// workflowSteps lists a workflow's steps and cleanup steps with their status. Pure.
func workflowSteps(wf store.Workflow) *workflowView {
	v := &workflowView{Workflow: wf}
	var steps, cleanup []workflow.Step
	// The rows were written by the engine from resolved profiles: a list it cannot read
	// shows as no steps.
	_ = json.Unmarshal([]byte(wf.Steps), &steps)
	_ = json.Unmarshal([]byte(wf.Cleanup), &cleanup)
	for i, st := range steps {
		v.StepList = append(v.StepList, stepView{Name: st.String(), Status: stepStatus(wf, "steps", i)})
	}
	for i, st := range cleanup {
		v.CleanupList = append(v.CleanupList, stepView{Name: st.String(), Status: stepStatus(wf, "cleanup", i)})
	}
	return v
}

// stepStatus is the status of step i of a workflow's phase ("steps" or "cleanup"): done before
// the workflow's step index, the workflow's state at it, pending after it; a succeeded
// workflow's steps are all done, and once cleanup runs the steps' outcome is decided ("ended").
// Pure.
func stepStatus(wf store.Workflow, phase string, i int) string {
	cur := wf.Phase
	if cur == "" {
		cur = "steps"
	}
	final := wf.State == "succeeded" || wf.State == "failed" || wf.State == "aborted"
	switch {
	case wf.State == "succeeded":
		return "done"
	case phase != cur && phase == "steps":
		return "ended"
	case phase != cur:
		return "pending"
	case i < wf.StepIndex:
		return "done"
	case i == wf.StepIndex && final:
		return wf.State
	case i == wf.StepIndex:
		return "running"
	case final:
		return "not run"
	}
	return "pending"
}

// ---------------------------------------------------------------- batches

// batchStates are the states the batch list filters by.
func batchStates() []string {
	return []string{store.BatchPending, store.BatchApproved, store.BatchRunning, store.BatchRejected, store.BatchCancelled}
}

type batchListView struct {
	State   string
	States  []string
	Batches []store.Batch
	Names   names
}

func (u *UI) batchList(w http.ResponseWriter, r *http.Request, s session) {
	ctx := r.Context()
	state := r.URL.Query().Get("state")
	list, err := u.svc.Batches(ctx, s.p, state, 200)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	nm, _, _, err := u.names(ctx, s.p)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	u.render(w, r, http.StatusOK, batchesPage(s, batchListView{State: state, States: batchStates(), Batches: list, Names: nm}))
}

// decision is a decision on a batch: the service's call and the code of its done message.
type decision struct {
	do   func(svc *metal.Service, ctx context.Context, p auth.Principal, id, reason string) (store.Batch, error)
	done string
}

// decisionOf is the decision of the action in the URL; false for another action. Pure.
func decisionOf(action string) (decision, bool) {
	switch action {
	case "approve":
		return decision{(*metal.Service).Approve, "approved"}, true
	case "reject":
		return decision{(*metal.Service).Reject, "rejected"}, true
	case "withdraw":
		return decision{(*metal.Service).Withdraw, "withdrawn"}, true
	}
	return decision{}, false
}

// decisionMessage is the batch page's message after a decision, by the code in its URL. Pure.
func decisionMessage(code string) string {
	switch code {
	case "approved":
		return "Your approval was recorded."
	case "rejected":
		return "The batch was rejected."
	case "withdrawn":
		return "Your approval was withdrawn."
	}
	return ""
}

type batchView struct {
	B       store.Batch
	Leaves  []store.Leaf
	Names   names
	Message string
	// Failures are its nodes whose workflow under it failed or was aborted (the first
	// batchFailures of them).
	Failures        []store.BatchFailure
	Failed, Aborted int
}

// batchFailures is how many of a batch's failed or aborted nodes its page lists.
const batchFailures = 100

// batchLeaves is how many of a batch's (subject, kind) leaves its page lists.
const batchLeaves = 200

func (u *UI) batchDetail(w http.ResponseWriter, r *http.Request, s session) {
	ctx := r.Context()
	b, leaves, err := u.svc.Batch(ctx, s.p, r.PathValue("id"), batchLeaves)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	nm, _, _, err := u.names(ctx, s.p)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	fails, err := u.svc.BatchFailures(ctx, s.p, b.ID)
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	v := batchView{B: b, Leaves: leaves, Names: nm, Message: decisionMessage(r.URL.Query().Get("done"))}
	v.Failed, v.Aborted = metal.FailureCounts(fails)
	v.Failures = fails[:min(len(fails), batchFailures)]
	u.render(w, r, http.StatusOK, batchPage(s, v))
}

func (u *UI) batchDecide(w http.ResponseWriter, r *http.Request, s session) {
	d, ok := decisionOf(r.PathValue("action"))
	if !ok {
		u.fail(w, r, &s, http.StatusNotFound, fmt.Sprintf("unknown action %q on a batch: accepted are approve, reject, withdraw", truncate(r.PathValue("action"), 32)))
		return
	}
	b, err := d.do(u.svc, r.Context(), s.p, r.PathValue("id"), r.PostFormValue("reason"))
	if err != nil {
		u.serviceError(w, r, &s, err)
		return
	}
	http.Redirect(w, r, "/ui/batches/"+url.PathEscape(b.ID)+"?done="+d.done, http.StatusSeeOther)
}

// ---------------------------------------------------------------- events

// Events a page shows.
const (
	defaultEvents = 100
	maxEvents     = 500
)

type eventsView struct {
	Node      string // filter: a node id or name, "" for every node
	Kinds     string // filter: kinds and prefixes (node.*), separated by commas; "" for every kind
	Limit     int
	Events    []store.Event
	NodeNames map[string]string // of the events' nodes the caller may read
	// RowsURL is where the live table refreshes from ("" for a page of older events, which
	// does not refresh: Before is the id its events precede).
	RowsURL  string
	Interval string
	Before   uint64
	// OlderURL pages back (the events before the oldest shown; "" when the page is not full:
	// there are none), NewestURL back to the live table ("" on it).
	OlderURL, NewestURL string
}

// eventsQuery is what the events page was asked for: the node, the kinds (the service checks
// each), how many, and before which event (0: the newest).
type eventsQuery struct {
	node   string
	kinds  []string
	limit  int
	before uint64
}

// parseEventsQuery reads the events page's parameters. Pure.
func parseEventsQuery(q url.Values) (eventsQuery, error) {
	out := eventsQuery{node: q.Get("node"), limit: defaultEvents}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxEvents {
			return out, fmt.Errorf("limit %q: accepted are whole numbers from 1 to %d (default %d)", truncate(s, 20), maxEvents, defaultEvents)
		}
		out.limit = n
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n < 1 {
			return out, fmt.Errorf("before %q: accepted is an event's number (#), a whole number from 1", truncate(s, 20))
		}
		out.before = n
	}
	for _, k := range strings.Split(q.Get("kind"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			out.kinds = append(out.kinds, k)
		}
	}
	return out, nil
}

// url is the events page's (or, with path /ui/events/rows, its table's) address for q, before
// the event before (0: the newest). Pure.
func (q eventsQuery) url(path string, before uint64) string {
	v := url.Values{}
	if q.node != "" {
		v.Set("node", q.node)
	}
	if len(q.kinds) > 0 {
		v.Set("kind", strings.Join(q.kinds, ","))
	}
	v.Set("limit", strconv.Itoa(q.limit))
	if before > 0 {
		v.Set("before", strconv.FormatUint(before, 10))
	}
	return path + "?" + v.Encode()
}

// newestEvents lists the n newest events q selects, newest first, as p sees them.
func (u *UI) newestEvents(ctx context.Context, p auth.Principal, q metal.EventQuery) ([]store.Event, error) {
	q.Newest = true
	evs, err := u.svc.ListEvents(ctx, p, q)
	slices.Reverse(evs)
	return evs, err
}

// refreshEvery is how often the events page refreshes its table (htmx polling).
const refreshEvery = 2 * time.Second

func (u *UI) loadEvents(w http.ResponseWriter, r *http.Request, s session) (eventsView, bool) {
	q, err := parseEventsQuery(r.URL.Query())
	if err != nil {
		u.fail(w, r, &s, http.StatusBadRequest, err.Error())
		return eventsView{}, false
	}
	v := eventsView{Node: q.node, Kinds: strings.Join(q.kinds, ", "), Limit: q.limit, Before: q.before, Interval: fmt.Sprintf("every %ds", int(refreshEvery.Seconds()))}
	if q.before == 0 {
		v.RowsURL = q.url("/ui/events/rows", 0)
	} else {
		v.NewestURL = q.url("/ui/events", 0)
	}
	v.Events, err = u.newestEvents(r.Context(), s.p, metal.EventQuery{Node: q.node, Kinds: q.kinds, Limit: q.limit, BeforeID: q.before})
	if err != nil {
		u.serviceError(w, r, &s, err)
		return eventsView{}, false
	}
	if len(v.Events) == q.limit {
		v.OlderURL = q.url("/ui/events", v.Events[len(v.Events)-1].ID)
	}
	v.NodeNames = u.nodeNames(r.Context(), s.p, v.Events)
	return v, true
}

// nodeNames names the nodes of events, each read through the service as the caller (a node
// deleted since, or not the caller's, keeps its id).
func (u *UI) nodeNames(ctx context.Context, p auth.Principal, evs []store.Event) map[string]string {
	out := map[string]string{}
	tried := map[string]bool{}
	for _, e := range evs {
		if e.NodeID == "" || tried[e.NodeID] {
			continue
		}
		tried[e.NodeID] = true
		if n, err := u.svc.Get(ctx, p, e.NodeID); err == nil {
			out[e.NodeID] = n.Name
		}
	}
	return out
}

func (u *UI) eventsPage(w http.ResponseWriter, r *http.Request, s session) {
	if v, ok := u.loadEvents(w, r, s); ok {
		u.render(w, r, http.StatusOK, eventsPage(s, v))
	}
}

func (u *UI) eventRows(w http.ResponseWriter, r *http.Request, s session) {
	s.fresh = true
	if v, ok := u.loadEvents(w, r, s); ok {
		u.render(w, r, http.StatusOK, eventsTable(v))
	}
}

// ---------------------------------------------------------------- formatting

// when formats a store time (microseconds) for a page.
func when(us int64) string {
	if us == 0 {
		return ""
	}
	return store.Micros(us).UTC().Format("2006-01-02 15:04:05Z")
}

// tenantNote says whether the session's token sees every tenant or one.
func tenantNote(s *session) string {
	if s.p.TenantID == "" {
		return ", every tenant"
	}
	return ", one tenant"
}

// plus marks a count that stopped at its bound.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func joinComma(s []string) string { return strings.Join(s, ", ") }

// plus marks a count that stopped at its bound.
func plus(capped bool) string {
	if capped {
		return "+"
	}
	return ""
}
