package redfish_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
	"bcd/internal/testlog"
)

// Against the lab's virtual BMC: the image is fetched by the BMC, the task followed to its end
// with each new percentage reported, and the version staged: BIOS runs after the next reset,
// the BMC's own firmware at once. The post-update baseline check (Firmware) sees them.
func TestUpdateFirmwareAgainstVirtualBMC(t *testing.T) {
	imgs := serve(t, http.FileServerFS(fsMap{
		"bios.img": redfishbmc.FirmwareImage("BIOS", "2.18.0"),
		"nic.img":  redfishbmc.FirmwareImage("NIC.Slot.1-1-1", "22.40.1000"),
		"bmc.img":  redfishbmc.FirmwareImage("BMC", "bcd-vbmc-2"),
	}.fs()))
	nic := redfishbmc.FirmwareComponent{ID: "NIC.Slot.1-1-1", Name: "Mellanox ConnectX-6", Version: "22.36.1010"}
	tests := []struct {
		name      string
		image     string
		component string
		version   string
		polls     int
		atOnce    bool
		progress  []int
	}{
		{"BIOS, derived from BiosVersion: no Targets", "/bios.img", "BIOS", "2.18.0", 0, false, []int{50, 100}},
		{"NIC by inventory id, 3 polls", "/nic.img", "NIC.Slot.1-1-1", "22.40.1000", 3, false, []int{50, 100}},
		{"BMC at once", "/bmc.img", "bmc", "bcd-vbmc-2", 0, true, []int{50, 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, func(c *redfishbmc.Config) {
				c.BiosVersion, c.Firmware, c.UpdatePolls = "2.17.1", []redfishbmc.FirmwareComponent{nic}, tt.polls
			}, nil)
			var got []int
			if err := r.note(r.c.UpdateFirmware(ctx(t), imgs+tt.image, []string{tt.component}, func(p int) { got = append(got, p) })); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.progress) {
				t.Errorf("progress = %v, want %v", got, tt.progress)
			}
			if n := r.svc.Count(redfishbmc.KindUpdate); n != 1 {
				t.Errorf("%d SimpleUpdate requests, want 1", n)
			}
			drift := func() []string {
				have, err := r.c.Firmware(ctx(t))
				if err != nil {
					t.Fatal(err)
				}
				return bmc.Drift(map[string]string{tt.component: tt.version}, have)
			}
			if tt.atOnce {
				if d := drift(); len(d) != 0 {
					t.Fatalf("drift after a BMC update: %v", d)
				}
				return
			}
			if d := drift(); len(d) != 1 {
				t.Fatalf("drift before the reset = %v, want the staged component", d)
			}
			if err := r.note(r.c.SetPower(ctx(t), bmc.ActionCycle)); err != nil {
				t.Fatal(err)
			}
			if d := drift(); len(d) != 0 {
				t.Fatalf("drift after the reset: %v", d)
			}
		})
	}
}

// fsMap serves byte slices as files.
type fsMap map[string][]byte

func (m fsMap) fs() fstest.MapFS {
	out := fstest.MapFS{}
	for name, b := range m {
		out[name] = &fstest.MapFile{Data: b}
	}
	return out
}

func TestUpdateFirmwareVirtualBMCFailures(t *testing.T) {
	imgs := serve(t, http.FileServerFS(fsMap{"bios.img": redfishbmc.FirmwareImage("BIOS", "2.18.0"), "junk.img": []byte("MZ")}.fs()))
	tests := []struct {
		name  string
		mod   func(*redfishbmc.Config)
		image string
		comps []string
		want  string
	}{
		{"task Exception", func(c *redfishbmc.Config) { c.Quirks.FirmwareUpdateFails = true }, "/bios.img", []string{"BIOS"},
			"ended Exception (status Critical): The task with Id '1' has been aborted: the firmware update failed"},
		{"not an image", nil, "/junk.img", []string{"BIOS"}, "not a firmware image"},
		{"no SimpleUpdate", func(c *redfishbmc.Config) { c.Quirks.NoSimpleUpdate = true }, "/bios.img", []string{"BIOS"},
			"lists no Actions and refuses SimpleUpdate at its DMTF URI /redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"},
		{"no UpdateService", func(c *redfishbmc.Config) { c.Quirks.NoUpdateService = true }, "/bios.img", []string{"BIOS"},
			"the BMC has no UpdateService"},
		{"unknown component", nil, "/bios.img", []string{"CPLD"}, "has no component CPLD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, func(c *redfishbmc.Config) {
				c.BiosVersion = "2.17.1"
				if tt.mod != nil {
					tt.mod(c)
				}
			}, nil)
			err := r.note(r.c.UpdateFirmware(ctx(t), imgs+tt.image, tt.comps, nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("UpdateFirmware = %v, want an error saying %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "updating firmware from "+imgs+tt.image) || !strings.Contains(err.Error(), " on Redfish BMC "+r.srv.URL+": ") {
				t.Errorf("error does not say what was done where: %v", err)
			}
			if v, _ := r.svc.FirmwareVersion("BIOS"); v != "2.17.1" || len(r.svc.PendingFirmware()) != 0 {
				t.Errorf("a failed update changed the BIOS: running %s, pending %v", v, r.svc.PendingFirmware())
			}
		})
	}
}

// dialUpdate is dial with a password that no expected text holds (the driver hides it).
func dialUpdate(t *testing.T, url string, opts redfish.Options) *redfish.Client {
	t.Helper()
	c, err := redfish.New(ctx(t), bmc.Endpoint{Address: url, Username: "u", Password: "Upd4te-Passw0rd"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// updateBMC is a scripted BMC with an UpdateService whose SimpleUpdate answer and task reads
// each test scripts.
type updateBMC struct {
	*scripted
	mu       sync.Mutex
	post     func(body map[string]any) (status int, location string, resp any)
	tasks    map[string][]taskStep // GET path -> answers, in turn (the last repeats)
	reads    map[string]int
	bodies   []map[string]any
	services func() (int, any) // the UpdateService
}

type taskStep struct {
	status int
	body   any
}

func newUpdateBMC(services map[string]any) *updateBMC {
	u := &updateBMC{scripted: newScripted(), tasks: map[string][]taskStep{}, reads: map[string]int{}}
	u.docs["/redfish/v1"] = func() (int, any) {
		return 200, map[string]any{"@odata.id": "/redfish/v1/", "Systems": ref("/redfish/v1/Systems"),
			"UpdateService": ref("/redfish/v1/UpdateService"),
			"Links":         map[string]any{"Sessions": ref("/redfish/v1/SessionService/Sessions")}}
	}
	u.docs["/redfish/v1/UpdateService"] = func() (int, any) { return 200, services }
	u.docs["/redfish/v1/UpdateService/FirmwareInventory"] = func() (int, any) {
		return 200, map[string]any{"Members": []any{
			ref("/redfish/v1/UpdateService/FirmwareInventory/Installed-159-2.17.1__BIOS.Setup.1-1"),
			ref("/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1")}}
	}
	u.docs["/redfish/v1/UpdateService/FirmwareInventory/Installed-159-2.17.1__BIOS.Setup.1-1"] = func() (int, any) {
		return 200, map[string]any{"Id": "Installed-159-2.17.1__BIOS.Setup.1-1", "Name": "BIOS", "Version": "2.17.1"}
	}
	u.docs["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"] = func() (int, any) {
		return 200, map[string]any{"Id": "NIC.Slot.1-1-1", "Name": "Mellanox ConnectX-6", "Version": "22.36.1010"}
	}
	return u
}

const simpleUpdateTarget = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"

func simpleUpdateService(protocols ...string) map[string]any {
	act := map[string]any{"target": simpleUpdateTarget}
	if protocols != nil {
		act["TransferProtocol@Redfish.AllowableValues"] = protocols
	}
	return map[string]any{"@odata.id": "/redfish/v1/UpdateService", "ServiceEnabled": true,
		"FirmwareInventory": ref("/redfish/v1/UpdateService/FirmwareInventory"),
		"Actions":           map[string]any{"#UpdateService.SimpleUpdate": act}}
}

func (u *updateBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	u.mu.Lock()
	switch {
	case r.Method == http.MethodPost && path == simpleUpdateTarget && u.post != nil:
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		u.bodies = append(u.bodies, body)
		st, loc, resp := u.post(body)
		u.mu.Unlock()
		if loc != "" {
			w.Header().Set("Location", loc)
		}
		writeAnswer(w, st, resp)
		return
	case r.Method == http.MethodGet && u.tasks[path] != nil:
		steps := u.tasks[path]
		i := min(u.reads[path], len(steps)-1)
		u.reads[path]++
		step := steps[i]
		u.mu.Unlock()
		writeAnswer(w, step.status, step.body)
		return
	}
	u.mu.Unlock()
	u.scripted.ServeHTTP(w, r)
}

func writeAnswer(w http.ResponseWriter, status int, body any) {
	if body == nil {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (u *updateBMC) posted() []map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.bodies)
}

func task(id, state, status string, pct int, messages ...string) map[string]any {
	t := map[string]any{"@odata.id": id, "@odata.type": "#Task.v1_4_3.Task", "TaskState": state, "PercentComplete": pct}
	if status != "" {
		t["TaskStatus"] = status
	}
	var ms []any
	for _, m := range messages {
		ms = append(ms, map[string]any{"MessageId": "Update.1.0.ApplyFailed", "Message": m})
	}
	if ms != nil {
		t["Messages"] = ms
	}
	return t
}

const (
	image  = "http://10.0.0.5/artifacts/0123abcd/bios.exe"
	dellID = "/redfish/v1/TaskService/Tasks/JID_398033659417"
)

// The vendor shapes of a SimpleUpdate and its task: what is sent, how the task is followed, what
// counts as success.
func TestUpdateFirmwareShapes(t *testing.T) {
	running := func(pct int) taskStep { return taskStep{200, task(dellID, "Running", "OK", pct)} }
	accepted := func(map[string]any) (int, string, any) { return 202, dellID, nil }
	tests := []struct {
		name     string
		service  map[string]any
		post     func(map[string]any) (int, string, any)
		tasks    map[string][]taskStep
		comps    []string
		wantErr  string
		progress []int
		bodies   []string // the POST bodies, as JSON
	}{
		{"iDRAC: 202, Location to the Task, then Completed", simpleUpdateService("HTTP"), accepted,
			map[string][]taskStep{dellID: {running(0), running(10), running(10), running(60), {200, task(dellID, "Completed", "OK", 100)}}},
			[]string{"Installed-159-2.17.1__BIOS.Setup.1-1"}, "", []int{0, 10, 60, 100},
			[]string{`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/Installed-159-2.17.1__BIOS.Setup.1-1"],"TransferProtocol":"HTTP"}`}},
		{"component by name maps to the inventory member", simpleUpdateService(), accepted,
			map[string][]taskStep{dellID: {{200, task(dellID, "Completed", "Warning", 100)}}},
			[]string{"bios", "NIC.Slot.1-1-1"}, "", []int{100},
			[]string{`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/Installed-159-2.17.1__BIOS.Setup.1-1","/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"],"TransferProtocol":"HTTP"}`}},
		{"derived BMC component: no Targets", simpleUpdateService(), accepted,
			map[string][]taskStep{dellID: {{200, task(dellID, "Completed", "", 100)}}},
			[]string{"NIC.Slot.1-1-1", "BMC"}, "", []int{100},
			[]string{`{"ImageURI":"` + image + `","TransferProtocol":"HTTP"}`}},
		{"DSP0266 task monitor: 202 while running, then the operation's 204", simpleUpdateService(),
			func(map[string]any) (int, string, any) {
				return 202, "https://bmc.example/redfish/v1/TaskMonitors/7", nil
			},
			map[string][]taskStep{"/redfish/v1/TaskMonitors/7": {{202, nil}, {202, task("/redfish/v1/TaskService/Tasks/7", "Running", "OK", 30)}, {204, nil}}},
			[]string{"NIC.Slot.1-1-1"}, "", []int{30}, nil},
		{"OpenBMC: the Task in the POST answer, no Location", simpleUpdateService(),
			func(map[string]any) (int, string, any) {
				return 202, "", task("/redfish/v1/TaskService/Tasks/0", "Running", "OK", 0)
			},
			map[string][]taskStep{"/redfish/v1/TaskService/Tasks/0": {{200, task("/redfish/v1/TaskService/Tasks/0", "Completed", "OK", 100)}}},
			[]string{"BMC"}, "", []int{0, 100}, nil},
		{"204 and no task: done", simpleUpdateService(), func(map[string]any) (int, string, any) { return 204, "", nil },
			nil, []string{"BMC"}, "", nil, nil},
		{"200 with a success message (iLO): done", simpleUpdateService(), func(map[string]any) (int, string, any) {
			return 200, "", map[string]any{"error": map[string]any{"code": "iLO.0.10.ExtendedInfo",
				"@Message.ExtendedInfo": []any{map[string]any{"MessageId": "Base.1.4.Success"}}}}
		}, nil, []string{"BMC"}, "", nil, nil},
		{"task Exception: its messages", simpleUpdateService(), accepted,
			map[string][]taskStep{dellID: {running(20), {200, task(dellID, "Exception", "Critical", 20,
				"Unable to download the image from 10.0.0.5.", "Update failed.")}}},
			[]string{"BMC"}, "the update task " + dellID + " ended Exception (status Critical): Unable to download the image from 10.0.0.5. " +
				"(Update.1.0.ApplyFailed); Update failed. (Update.1.0.ApplyFailed)", []int{20}, nil},
		{"Completed but Critical: failure", simpleUpdateService(), accepted,
			map[string][]taskStep{dellID: {{200, task(dellID, "Completed", "Critical", 100, "Flash write failed.")}}},
			[]string{"BMC"}, "ended Completed (status Critical): Flash write failed.", []int{100}, nil},
		{"Cancelled", simpleUpdateService(), accepted,
			map[string][]taskStep{dellID: {{200, task(dellID, "Cancelled", "", 5)}}},
			[]string{"BMC"}, "ended Cancelled (status none): no message", []int{5}, nil},
		{"iDRAC: staged BIOS job Scheduled: done until the reset", simpleUpdateService("HTTP"), accepted,
			map[string][]taskStep{dellID: {running(0), {200, map[string]any{"@odata.id": dellID, "TaskState": "Starting", "PercentComplete": 0,
				"Oem": map[string]any{"Dell": map[string]any{"JobState": "Scheduled", "Message": "Task successfully scheduled."}}}}}},
			[]string{"BIOS"}, "", []int{0}, nil},
		{"iDRAC: task deleted once finished, found as a job", simpleUpdateService("HTTP"), accepted,
			map[string][]taskStep{dellID: {running(40), {404, map[string]any{"error": map[string]any{"message": "gone"}}}},
				"/redfish/v1/JobService/Jobs/JID_398033659417": {{200, map[string]any{"@odata.id": "/redfish/v1/JobService/Jobs/JID_398033659417",
					"JobState": "Completed", "Message": "Job completed successfully.", "PercentComplete": 100}}}},
			[]string{"BMC"}, "", []int{40, 100}, nil},
		{"iDRAC: job deleted too: outcome unknown", simpleUpdateService("HTTP"), accepted,
			map[string][]taskStep{dellID: {running(40), {404, nil}}},
			[]string{"BMC"}, "removed the update task /redfish/v1/JobService/Jobs/JID_398033659417 before reporting how it ended (last seen Running)", []int{40}, nil},
		{"monitor's final answer is the operation's failure", simpleUpdateService(),
			func(map[string]any) (int, string, any) { return 202, "/redfish/v1/TaskMonitors/9", nil },
			map[string][]taskStep{"/redfish/v1/TaskMonitors/9": {{202, nil}, {400, map[string]any{"error": map[string]any{"code": "Base.1.8.GeneralError",
				"message": "bad image", "@Message.ExtendedInfo": []any{map[string]any{"MessageId": "Update.1.0.InvalidImage", "Message": "The image is not signed."}}}}}}},
			[]string{"BMC"}, "ended in failure: HTTP 400: The image is not signed. (Update.1.0.InvalidImage)", nil, nil},
		{"BMC restarting: failed reads are polled through", simpleUpdateService(), accepted,
			map[string][]taskStep{dellID: {running(90), {503, nil}, {502, nil}, {500, nil}, {200, task(dellID, "Completed", "OK", 100)}}},
			[]string{"BMC"}, "", []int{90, 100}, nil},
		{"TransferProtocol refused (no allowed values listed): sent again without", simpleUpdateService(),
			func(b map[string]any) (int, string, any) {
				if _, ok := b["TransferProtocol"]; ok {
					return 400, "", map[string]any{"error": map[string]any{"code": "Base.1.8.GeneralError", "message": "no",
						"@Message.ExtendedInfo": []any{map[string]any{"MessageId": "Base.1.8.ActionParameterNotSupported", "Message": "TransferProtocol is not supported."}}}}
				}
				return 204, "", nil
			}, nil, []string{"NIC.Slot.1-1-1"}, "", nil,
			[]string{`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"],"TransferProtocol":"HTTP"}`,
				`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"]}`}},
		{"Targets refused (iDRAC), protocols listed: sent again without Targets", simpleUpdateService("HTTP"),
			refuse("Targets"), nil, []string{"NIC.Slot.1-1-1"}, "", []int{100},
			[]string{`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"],"TransferProtocol":"HTTP"}`,
				`{"ImageURI":"` + image + `","TransferProtocol":"HTTP"}`}},
		{"Targets refused, no protocols listed: without TransferProtocol, then without Targets", simpleUpdateService(),
			refuse("Targets"), nil, []string{"NIC.Slot.1-1-1"}, "", []int{100},
			[]string{`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"],"TransferProtocol":"HTTP"}`,
				`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"]}`,
				`{"ImageURI":"` + image + `"}`}},
		{"refused for another reason: not sent again", simpleUpdateService("HTTP"),
			func(map[string]any) (int, string, any) {
				st, body := redfishErr(400, "Base.1.8.PropertyValueFormatError")
				return st, "", body
			}, nil,
			[]string{"NIC.Slot.1-1-1"}, "refused: Base.1.8.PropertyValueFormatError", nil,
			[]string{`{"ImageURI":"` + image + `","Targets":["/redfish/v1/UpdateService/FirmwareInventory/NIC.Slot.1-1-1"],"TransferProtocol":"HTTP"}`}},
		{"no Actions listed: the DMTF URI is tried", map[string]any{"@odata.id": "/redfish/v1/UpdateService",
			"FirmwareInventory": ref("/redfish/v1/UpdateService/FirmwareInventory")},
			func(map[string]any) (int, string, any) { return 204, "", nil }, nil, []string{"BMC"}, "", nil,
			[]string{`{"ImageURI":"` + image + `","TransferProtocol":"HTTP"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpdateBMC(tt.service)
			u.post, u.tasks = tt.post, tt.tasks
			c := dialUpdate(t, serve(t, u), quirkOpts())
			var got []int
			err := c.UpdateFirmware(ctx(t), image, tt.comps, func(p int) { got = append(got, p) })
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("UpdateFirmware: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("UpdateFirmware = %v, want an error saying %q", err, tt.wantErr)
			}
			if err != nil && (!strings.HasPrefix(err.Error(), "updating firmware from "+image) || !strings.Contains(err.Error(), " on Redfish BMC http://127.0.0.1:")) {
				t.Errorf("error does not say what was done where: %v", err)
			}
			if !slices.Equal(got, tt.progress) {
				t.Errorf("progress = %v, want %v", got, tt.progress)
			}
			if tt.bodies != nil {
				var sent []string
				for _, b := range u.posted() {
					j, _ := json.Marshal(b)
					sent = append(sent, string(j))
				}
				if !slices.Equal(sent, tt.bodies) {
					t.Errorf("POSTed\n%s\nwant\n%s", strings.Join(sent, "\n"), strings.Join(tt.bodies, "\n"))
				}
			}
		})
	}
}

// refuse answers a SimpleUpdate that carries param as iDRAC answers a parameter it does not
// support, and accepts one without it.
func refuse(param string) func(map[string]any) (int, string, any) {
	return func(b map[string]any) (int, string, any) {
		if _, ok := b[param]; ok {
			st, body := redfishErr(400, "Base.1.8.ActionParameterNotSupported")
			return st, "", body
		}
		return 202, dellID, task(dellID, "Completed", "OK", 100)
	}
}

// Refusals before anything is POSTed: a BMC that cannot take the update says why.
func TestUpdateFirmwareRefusedBeforePosting(t *testing.T) {
	tests := []struct {
		name    string
		service map[string]any
		noUS    bool
		image   string
		comps   []string
		want    string
	}{
		{"no UpdateService", nil, true, image, []string{"BMC"}, "the BMC has no UpdateService (the service root links none)"},
		{"HTTP not allowed", simpleUpdateService("HTTPS", "NFS"), false, image, []string{"BMC"},
			"does not accept TransferProtocol HTTP (allowed: HTTPS, NFS)"},
		{"HTTPS not allowed (iDRAC before 5.00)", simpleUpdateService("HTTP"), false, "https://10.0.0.5/bios.exe", []string{"BMC"},
			"does not accept TransferProtocol HTTPS (allowed: HTTP)"},
		{"other actions only", map[string]any{"@odata.id": "/redfish/v1/UpdateService",
			"Actions": map[string]any{"#UpdateService.StartUpdate": map[string]any{"target": "/x"}}}, false, image, []string{"BMC"},
			"offers no SimpleUpdate action (it lists #UpdateService.StartUpdate)"},
		{"disabled", map[string]any{"@odata.id": "/redfish/v1/UpdateService", "ServiceEnabled": false}, false, image, []string{"BMC"},
			"is disabled"},
		{"unknown component", simpleUpdateService(), false, image, []string{"CPLD"},
			"has no component CPLD (ids are matched, then names, ignoring case; it holds: Installed-159-2.17.1__BIOS.Setup.1-1, NIC.Slot.1-1-1)"},
		{"no component", simpleUpdateService(), false, image, nil, "no component named"},
		{"empty component", simpleUpdateService(), false, image, []string{""}, "a component name is empty"},
		{"tftp URL", simpleUpdateService(), false, "tftp://10.0.0.5/bios.exe", []string{"BMC"}, "is not an http:// or https:// URL"},
		{"no host", simpleUpdateService(), false, "http:///bios.exe", []string{"BMC"}, "is not an http:// or https:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpdateBMC(tt.service)
			if tt.noUS {
				delete(u.docs, "/redfish/v1/UpdateService")
				u.docs["/redfish/v1"] = func() (int, any) {
					return 200, map[string]any{"Links": map[string]any{"Sessions": ref("/redfish/v1/SessionService/Sessions")}}
				}
			}
			u.post = func(map[string]any) (int, string, any) { return 204, "", nil }
			c := dialUpdate(t, serve(t, u), quirkOpts())
			err := c.UpdateFirmware(ctx(t), tt.image, tt.comps, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("UpdateFirmware = %v, want an error saying %q", err, tt.want)
			}
			if n := len(u.posted()); n != 0 {
				t.Fatalf("%d SimpleUpdate POSTs, want none", n)
			}
		})
	}
}

// The caller's deadline ends the wait on a task that keeps running: the error says where it
// stood and wraps the context's error.
func TestUpdateFirmwareDeadline(t *testing.T) {
	u := newUpdateBMC(simpleUpdateService())
	u.post = func(map[string]any) (int, string, any) { return 202, dellID, nil }
	u.tasks[dellID] = []taskStep{{200, task(dellID, "Running", "OK", 40)}}
	c := dialUpdate(t, serve(t, u), quirkOpts())
	cctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var got []int
	err := c.UpdateFirmware(cctx, image, []string{"BMC"}, func(p int) { got = append(got, p) })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for the update task "+dellID+": still Running at 40%") {
		t.Fatalf("UpdateFirmware = %v, want the deadline, naming the task's state", err)
	}
	if !slices.Equal(got, []int{40}) {
		t.Errorf("progress = %v, want [40] (reported once)", got)
	}
}

// A session the BMC drops while it restarts into new firmware is logged in again.
func TestUpdateFirmwareSessionLost(t *testing.T) {
	u := newUpdateBMC(simpleUpdateService())
	u.post = func(map[string]any) (int, string, any) { return 202, dellID, nil }
	u.tasks[dellID] = []taskStep{{200, task(dellID, "Running", "OK", 80)}, {401, nil}, {200, task(dellID, "Completed", "OK", 100)}}
	c := dialUpdate(t, serve(t, u), quirkOpts())
	if err := c.UpdateFirmware(ctx(t), image, []string{"BMC"}, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(u.requests("POST /redfish/v1/SessionService/Sessions")); n != 2 {
		t.Fatalf("%d logins, want 2 (one again after the 401)", n)
	}
}

// A secret in the image URL (a pre-signed query) never shows, even where the BMC echoes the URL
// in the task's messages.
func TestUpdateFirmwareURLNeverShown(t *testing.T) {
	secretURL := "http://10.0.0.5/bios.exe?X-Amz-Signature=5ign4ture-s3cret"
	logs := &testlog.Buffer{}
	u := newUpdateBMC(simpleUpdateService())
	u.post = func(map[string]any) (int, string, any) { return 202, dellID, nil }
	u.tasks[dellID] = []taskStep{{200, task(dellID, "Exception", "Critical", 0, "Cannot download "+secretURL+" (5ign4ture-s3cret).")}}
	opts := quirkOpts()
	opts.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := dialUpdate(t, serve(t, u), opts)
	err := c.UpdateFirmware(ctx(t), secretURL, []string{"BMC"}, nil)
	if err == nil {
		t.Fatal("UpdateFirmware succeeded on an Exception")
	}
	for _, text := range append(errorTexts(err), logs.String()) {
		if strings.Contains(text, "5ign4ture") {
			t.Errorf("the URL's secret shows: %s", text)
		}
	}
	if !strings.Contains(err.Error(), "Cannot download http://10.0.0.5/bios.exe ([redacted]).") {
		t.Errorf("error = %v, want the BMC's message with the URL shown without its query", err)
	}
}

func TestUpdateTargets(t *testing.T) {
	inv := []redfish.InventoryMember{
		{URI: "/fw/Installed-BIOS", ID: "Installed-159-2.17.1__BIOS.Setup.1-1", Name: "BIOS"},
		{URI: "/fw/nic", ID: "NIC.Slot.1-1-1", Name: "Mellanox ConnectX-6"},
		{URI: "/fw/bmc", ID: "bmc", Name: "Integrated BMC"},
	}
	tests := []struct {
		comps []string
		want  []string
		err   string
	}{
		{[]string{"NIC.Slot.1-1-1"}, []string{"/fw/nic"}, ""},
		{[]string{"nic.slot.1-1-1", "BIOS"}, []string{"/fw/nic", "/fw/Installed-BIOS"}, ""},
		{[]string{"BMC"}, []string{"/fw/bmc"}, ""},                                   // by id, ignoring case
		{[]string{"Mellanox ConnectX-6", "NIC.Slot.1-1-1"}, []string{"/fw/nic"}, ""}, // once
		{[]string{"CPLD", "GPU"}, nil, "no component CPLD, GPU"},
	}
	for _, tt := range tests {
		got, err := redfish.UpdateTargets(inv, tt.comps)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("UpdateTargets(%v) error = %v, want %q", tt.comps, err, tt.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("UpdateTargets(%v) = %v, %v; want %v", tt.comps, got, err, tt.want)
		}
	}
	// A derived component (no member: BIOS from BiosVersion) sends no Targets at all.
	got, err := redfish.UpdateTargets(inv[1:2], []string{"NIC.Slot.1-1-1", "bios"})
	if err != nil || got != nil {
		t.Errorf("UpdateTargets with a derived BIOS = %v, %v; want nil (no Targets)", got, err)
	}
}

func TestTransferProtocol(t *testing.T) {
	tests := []struct {
		url     string
		allowed []string
		want    string
		err     string
	}{
		{"http://10.0.0.5/a", nil, "HTTP", ""},
		{"https://site.example/a", nil, "HTTPS", ""},
		{"http://10.0.0.5/a", []string{"CIFS", "http"}, "HTTP", ""},
		{"http://10.0.0.5/a", []string{"HTTPS"}, "", "does not accept TransferProtocol HTTP (allowed: HTTPS)"},
		{"nfs://10.0.0.5/a", nil, "", "not an http:// or https:// URL"},
		{"10.0.0.5/a", nil, "", "not an http:// or https:// URL"},
		{"http://user:pa55@10.0.0.5/a", []string{"FTP"}, "", "does not accept"},
	}
	for _, tt := range tests {
		got, err := redfish.TransferProtocol(tt.url, tt.allowed)
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("TransferProtocol(%q, %v) = %q, %v; want %q", tt.url, tt.allowed, got, err, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("TransferProtocol(%q, %v) error = %v, want %q", tt.url, tt.allowed, err, tt.err)
		}
		if err != nil && strings.Contains(err.Error(), "pa55") {
			t.Errorf("TransferProtocol error shows the URL's password: %v", err)
		}
	}
}
