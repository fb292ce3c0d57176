package redfishbmc

import (
	"bufio"
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
)

// Firmware updates as DMTF's UpdateService schema and DSP0266's asynchronous operations describe
// them: the client POSTs UpdateService.SimpleUpdate with an ImageURI (and optional Targets,
// inventory member URIs); the service answers 202 Accepted with a Location naming a Task, which
// the client polls until its TaskState ends. The image is fetched during the POST, but checked
// as a real BMC checks it, asynchronously: a bad image or target ends the task in Exception.
// The new version of the BMC's own firmware applies when the task completes; any other
// component's at the next reset that boots the host (with the pending BIOS settings).

const (
	simpleUpdateURI = updateURI + "/Actions/UpdateService.SimpleUpdate"
	taskServiceURI  = root + "/TaskService"
	tasksURI        = taskServiceURI + "/Tasks"

	// firmwareMagic is the first line of a lab firmware image.
	firmwareMagic = "bcd-vbmc-firmware"
	// maxFirmwareImage bounds the image a SimpleUpdate fetches.
	maxFirmwareImage = 64 << 20
	// bmcComponent and biosComponent are the pseudo-components a client derives from the
	// manager's FirmwareVersion and the system's BiosVersion when the inventory lacks them.
	bmcComponent  = "BMC"
	biosComponent = "BIOS"
	// defaultBMCVersion is the manager's FirmwareVersion before any update.
	defaultBMCVersion = "bcd-vbmc-1"
)

// FirmwareImage builds a lab firmware image that installs version on component (an inventory
// id, or BIOS / BMC): what SimpleUpdate accepts (for tests and the lab's catalog).
func FirmwareImage(component, version string) []byte {
	return []byte(firmwareMagic + "\ncomponent=" + component + "\nversion=" + version + "\n")
}

// ParseFirmwareImage reads a lab firmware image: the line bcd-vbmc-firmware, then one
// component=ID and one version=V line (blank lines are ignored). Pure.
func ParseFirmwareImage(b []byte) (component, version string, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 4096)
	first := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if first {
			if line != firmwareMagic {
				return "", "", fmt.Errorf("not a firmware image for this BMC (it does not start with %q)", firmwareMagic)
			}
			first = false
			continue
		}
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		switch {
		case !ok:
			return "", "", fmt.Errorf("firmware image line %q is not key=value", clip(line))
		case k == "component" && component == "" && v != "":
			component = v
		case k == "version" && version == "" && v != "":
			version = v
		default:
			return "", "", fmt.Errorf("firmware image line %q is not accepted (one component= and one version=, not empty)", clip(line))
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("reading the firmware image: %w", err)
	}
	if first {
		return "", "", errors.New("the firmware image is empty")
	}
	if component == "" || version == "" {
		return "", "", errors.New("the firmware image names no component or no version")
	}
	return component, version, nil
}

// shownURL is u without user information, query and fragment (they may hold a credential).
func shownURL(u *url.URL) string { return u.Scheme + "://" + u.Host + u.Path }

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// fwTask is a firmware update task: it shows Running for polls GETs, then its outcome.
type fwTask struct {
	id        string
	polls     int    // GETs left that show Running
	fail      string // "": success; else the Exception's message
	component string
	version   string
	done      bool
}

// updateServiceResource is the UpdateService, with the SimpleUpdate action unless a quirk
// leaves it out (then the resource lists no Actions at all).
func (s *Service) updateServiceResource() map[string]any {
	res := map[string]any{"@odata.id": updateURI, "@odata.type": "#UpdateService.v1_11_0.UpdateService",
		"Id": "UpdateService", "Name": "Update Service", "ServiceEnabled": true,
		"FirmwareInventory": ref(firmwareURI)}
	if !s.cfg.Quirks.NoSimpleUpdate {
		res["Actions"] = map[string]any{"#UpdateService.SimpleUpdate": map[string]any{"target": simpleUpdateURI,
			"TransferProtocol@Redfish.AllowableValues": []string{"HTTP", "HTTPS"}}}
	}
	return res
}

func (s *Service) taskServiceResource() map[string]any {
	return map[string]any{"@odata.id": taskServiceURI, "@odata.type": "#TaskService.v1_1_4.TaskService",
		"Id": "TaskService", "Name": "Task Service", "ServiceEnabled": true, "CompletedTaskOverWritePolicy": "Oldest",
		"Tasks": ref(tasksURI)}
}

func (s *Service) tasksCollection() map[string]any {
	s.mu.Lock()
	ids := make([]string, 0, len(s.tasks))
	for _, t := range s.tasks {
		ids = append(ids, t.id)
	}
	s.mu.Unlock()
	slices.SortFunc(ids, func(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b)) })
	members := make([]string, len(ids))
	for i, id := range ids {
		members[i] = tasksURI + "/" + id
	}
	return collection(tasksURI, "#TaskCollection.TaskCollection", "Task Collection", members...)
}

// taskResource is the Task as it stands; read reports a client's poll (it advances the task).
func (s *Service) taskResource(ctx context.Context, id string, read bool) (map[string]any, bool) {
	s.mu.Lock()
	t, ok := s.tasks[id]
	if !ok {
		s.mu.Unlock()
		return nil, false
	}
	running := t.polls > 0
	if read && running {
		t.polls--
	}
	finish := read && !running && !t.done
	if finish {
		t.done = true
	}
	tc := *t
	s.mu.Unlock()
	if finish && tc.fail == "" {
		s.stageFirmware(ctx, tc.component, tc.version)
	}
	res := map[string]any{"@odata.id": tasksURI + "/" + id, "@odata.type": "#Task.v1_4_3.Task", "Id": id,
		"Name": "Firmware update task " + id, "TaskMonitor": tasksURI + "/" + id}
	switch {
	case running:
		res["TaskState"], res["TaskStatus"], res["PercentComplete"] = "Running", "OK", 50
		res["Messages"] = []any{taskMessage("TaskEvent.1.0.3.TaskStarted", "The task with Id '"+id+"' has started.", "OK")}
	case tc.fail != "":
		res["TaskState"], res["TaskStatus"], res["PercentComplete"] = "Exception", "Critical", 100
		res["Messages"] = []any{taskMessage("TaskEvent.1.0.3.TaskAborted", "The task with Id '"+id+"' has been aborted: "+tc.fail, "Critical")}
	default:
		res["TaskState"], res["TaskStatus"], res["PercentComplete"] = "Completed", "OK", 100
		res["Messages"] = []any{taskMessage("TaskEvent.1.0.3.TaskCompletedOK", "The task with Id '"+id+"' has completed.", "OK")}
	}
	return res, true
}

func taskMessage(id, text, severity string) map[string]any {
	return map[string]any{"@odata.type": "#Message.v1_1_1.Message", "MessageId": id, "Message": text,
		"MessageSeverity": severity}
}

// simpleUpdate handles UpdateService.SimpleUpdate.
func (s *Service) simpleUpdate(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "Base.1.15.OperationNotAllowed", "The HTTP method is not allowed on this resource.")
		return
	}
	var body struct {
		ImageURI         string
		TransferProtocol string
		Targets          []string
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	if body.ImageURI == "" {
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterMissing", "The action UpdateService.SimpleUpdate requires the parameter ImageURI.")
		return
	}
	if p := body.TransferProtocol; p != "" && p != "HTTP" && p != "HTTPS" {
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterNotSupported",
			"The parameter TransferProtocol value "+p+" is not supported by this service (HTTP, HTTPS).")
		return
	}
	u, err := url.Parse(body.ImageURI)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterValueFormatError",
			"The parameter ImageURI is not an http or https URL.")
		return
	}
	component, version, fail := s.checkImage(ctx, u, body.Targets)
	if fail == "" && s.cfg.Quirks.FirmwareUpdateFails {
		fail = "the firmware update failed while writing the flash (quirk)"
	}
	polls := s.cfg.UpdatePolls
	if polls <= 0 {
		polls = 1
	}
	s.mu.Lock()
	if s.tasks == nil {
		s.tasks = map[string]*fwTask{}
	}
	s.nextTask++
	id := fmt.Sprint(s.nextTask)
	s.tasks[id] = &fwTask{id: id, polls: polls, fail: fail, component: component, version: version}
	s.mu.Unlock()
	s.log.InfoContext(ctx, "redfish firmware update accepted", "task", id, "image", shownURL(u),
		"component", component, "version", version, "fails", fail != "")
	res, _ := s.taskResource(ctx, id, false)
	w.Header().Set("Location", tasksURI+"/"+id)
	writeJSON(w, http.StatusAccepted, res)
}

// checkImage fetches and checks an image against the targets (inventory member URIs; none: any
// component). It returns the component and version, or why the update fails ("" when it does not).
func (s *Service) checkImage(ctx context.Context, u *url.URL, targets []string) (component, version, fail string) {
	b, err := s.fetchImage(ctx, u)
	if err != nil {
		return "", "", "fetching the image failed: " + err.Error()
	}
	component, version, err = ParseFirmwareImage(b)
	if err != nil {
		return "", "", err.Error()
	}
	inv := s.firmwareSnapshot()
	var targetIDs []string
	for _, t := range targets {
		id, ok := strings.CutPrefix(strings.TrimSuffix(t, "/"), firmwareURI+"/")
		if !ok || !slices.ContainsFunc(inv, func(f FirmwareComponent) bool { return f.ID == id }) {
			return "", "", fmt.Sprintf("the target %s is not a member of %s", clip(t), firmwareURI)
		}
		targetIDs = append(targetIDs, id)
	}
	known := slices.ContainsFunc(inv, func(f FirmwareComponent) bool { return f.ID == component }) ||
		component == bmcComponent || component == biosComponent
	switch {
	case !known:
		return "", "", fmt.Sprintf("the image is for component %s, which this BMC does not have", clip(component))
	case len(targetIDs) > 0 && !slices.Contains(targetIDs, component):
		return "", "", fmt.Sprintf("the image is for component %s, which is not among the targets %s", clip(component), strings.Join(targetIDs, ", "))
	}
	return component, version, ""
}

// fetchImage downloads an image of at most maxFirmwareImage bytes.
func (s *Service) fetchImage(ctx context.Context, u *url.URL) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Fetch.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, which may hold a credential
		}
		return nil, fmt.Errorf("GET %s: %w", shownURL(u), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", shownURL(u), resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxFirmwareImage+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", shownURL(u), err)
	}
	if len(b) > maxFirmwareImage {
		return nil, fmt.Errorf("GET %s: the image is larger than %d bytes", shownURL(u), maxFirmwareImage)
	}
	return b, nil
}

// stageFirmware records a successful update: the BMC's own firmware runs at once, any other
// component's new version at the next reset that boots the host.
func (s *Service) stageFirmware(ctx context.Context, component, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if component == bmcComponent {
		s.setVersionLocked(component, version)
		s.log.InfoContext(ctx, "redfish BMC firmware updated", "version", version)
		return
	}
	if s.fwPending == nil {
		s.fwPending = map[string]string{}
	}
	s.fwPending[component] = version
	s.log.InfoContext(ctx, "redfish firmware update staged for the next reset", "component", component, "version", version)
}

// setVersionLocked sets the running version of a component: its inventory member, and the
// manager's FirmwareVersion (BMC) or the system's BiosVersion (BIOS). s.mu is held.
func (s *Service) setVersionLocked(component, version string) {
	for i := range s.firmware {
		if s.firmware[i].ID == component {
			s.firmware[i].Version = version
		}
	}
	switch component {
	case bmcComponent:
		s.bmcVersion = version
	case biosComponent:
		s.biosVersion = version
	}
}

// applyFirmware runs the staged versions, as the host's firmware does when it starts; it
// returns the components updated.
func (s *Service) applyFirmware() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	pending := s.fwPending
	s.fwPending = nil
	for c, v := range pending {
		s.setVersionLocked(c, v)
	}
	return slices.Sorted(maps.Keys(pending))
}

// firmwareSnapshot is a copy of the inventory.
func (s *Service) firmwareSnapshot() []FirmwareComponent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.firmware)
}

// FirmwareVersion returns the running version of a component (an inventory id, BIOS or BMC),
// for tests; ok is false for an unknown component.
func (s *Service) FirmwareVersion(component string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.firmware {
		if f.ID == component {
			return f.Version, true
		}
	}
	switch component {
	case bmcComponent:
		return s.bmcVersion, true
	case biosComponent:
		return s.biosVersion, s.biosVersion != ""
	}
	return "", false
}

// PendingFirmware returns a copy of the versions staged for the next reset (for tests).
func (s *Service) PendingFirmware() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.fwPending)
}

// errTaskMissing: no task has the id a GET names.
var errTaskMissing = errors.New("no such task")
