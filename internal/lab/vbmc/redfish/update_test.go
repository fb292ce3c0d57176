package redfishbmc

import (
	"bytes"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// imageServer serves files by path on loopback and counts the GETs.
type imageServer struct {
	files map[string][]byte
	gets  atomic.Int32
}

func (s *imageServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.gets.Add(1)
	b, ok := s.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = w.Write(b)
}

func serveImages(t *testing.T, files map[string][]byte) (string, *imageServer) {
	t.Helper()
	is := &imageServer{files: files}
	srv := httptest.NewServer(is)
	t.Cleanup(srv.Close)
	return srv.URL, is
}

func dellLike(c *Config) {
	c.BiosVersion = "2.17.1"
	c.Firmware = []FirmwareComponent{{ID: "BIOS", Name: "BIOS", Version: "2.17.1"},
		{ID: "NIC.Slot.1-1-1", Name: "Mellanox ConnectX-6", Version: "22.36.1010"}}
}

func TestParseFirmwareImage(t *testing.T) {
	tests := []struct {
		in            string
		comp, version string
		err           string
	}{
		{string(FirmwareImage("BIOS", "2.18.0")), "BIOS", "2.18.0", ""},
		{"bcd-vbmc-firmware\r\n\r\ncomponent=NIC.Slot.1-1-1\r\nversion=1 2\r\n", "NIC.Slot.1-1-1", "1 2", ""},
		{"", "", "", "empty"},
		{"MZ\x90\x00binary", "", "", "not a firmware image"},
		{"bcd-vbmc-firmware\ncomponent=BIOS\n", "", "", "no component or no version"},
		{"bcd-vbmc-firmware\ncomponent=BIOS\ncomponent=BMC\nversion=1\n", "", "", "not accepted"},
		{"bcd-vbmc-firmware\ncomponent=BIOS\nversion=\n", "", "", "not accepted"},
		{"bcd-vbmc-firmware\nhello\n", "", "", "not key=value"},
		{"bcd-vbmc-firmware\nsize=1\n", "", "", "not accepted"},
		{"bcd-vbmc-firmware\ncomponent=" + strings.Repeat("x", 5000) + "\n", "", "", "reading the firmware image"},
	}
	for _, tt := range tests {
		comp, version, err := ParseFirmwareImage([]byte(tt.in))
		switch {
		case tt.err == "" && (err != nil || comp != tt.comp || version != tt.version):
			t.Errorf("ParseFirmwareImage(%q) = %q, %q, %v; want %q, %q", tt.in, comp, version, err, tt.comp, tt.version)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParseFirmwareImage(%q) error = %v, want one saying %q", tt.in, err, tt.err)
		}
	}
}

// A good update: 202 with a Location naming the Task, Running at 50% for UpdatePolls reads, then
// Completed/OK 100; the version is staged and applied at the next reset that boots the host;
// the BMC's own firmware applies at once.
func TestSimpleUpdate(t *testing.T) {
	imgs, _ := serveImages(t, map[string][]byte{
		"/bios.img": FirmwareImage("BIOS", "2.18.0"),
		"/nic.img":  FirmwareImage("NIC.Slot.1-1-1", "22.40.1000"),
		"/bmc.img":  FirmwareImage("BMC", "bcd-vbmc-2"),
	})
	tests := []struct {
		name      string
		image     string
		targets   []string
		polls     int
		component string
		version   string
		atOnce    bool
	}{
		{"BIOS targeted", imgs + "/bios.img", []string{firmwareURI + "/BIOS"}, 0, "BIOS", "2.18.0", false},
		{"NIC untargeted, 3 polls", imgs + "/nic.img", nil, 3, "NIC.Slot.1-1-1", "22.40.1000", false},
		{"BMC at once", imgs + "/bmc.img", nil, 0, "BMC", "bcd-vbmc-2", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { dellLike(c); c.UpdatePolls = tt.polls })
			e.m.SetOn(true)
			_, _, us := e.do("GET", updateURI, nil, nil)
			act, _ := us["Actions"].(map[string]any)["#UpdateService.SimpleUpdate"].(map[string]any)
			if act["target"] != simpleUpdateURI {
				t.Fatalf("UpdateService actions = %v", us["Actions"])
			}
			before, _ := e.svc.FirmwareVersion(tt.component)
			body := map[string]any{"ImageURI": tt.image, "TransferProtocol": "HTTP"}
			if tt.targets != nil {
				body["Targets"] = tt.targets
			}
			code, hdr, res := e.do("POST", simpleUpdateURI, body, nil)
			loc := hdr.Get("Location")
			if code != http.StatusAccepted || !strings.HasPrefix(loc, tasksURI+"/") || res["@odata.id"] != loc || res["TaskState"] != "Running" {
				t.Fatalf("POST SimpleUpdate = %d, Location %q, %v", code, loc, res)
			}
			if n := e.svc.Count(KindUpdate); n != 1 {
				t.Errorf("%d update requests counted, want 1", n)
			}
			polls := max(tt.polls, 1)
			for i := range polls {
				_, _, task := e.do("GET", loc, nil, nil)
				if task["TaskState"] != "Running" || task["PercentComplete"] != float64(50) {
					t.Fatalf("poll %d: %v %v, want Running 50", i+1, task["TaskState"], task["PercentComplete"])
				}
				if v, _ := e.svc.FirmwareVersion(tt.component); v != before {
					t.Fatalf("poll %d: version %s while the task runs", i+1, v)
				}
			}
			_, _, task := e.do("GET", loc, nil, nil)
			if task["TaskState"] != "Completed" || task["TaskStatus"] != "OK" || task["PercentComplete"] != float64(100) {
				t.Fatalf("final poll: %v", task)
			}
			_, _, col := e.do("GET", tasksURI, nil, nil)
			if members, _ := col["Members"].([]any); len(members) != 1 || members[0].(map[string]any)["@odata.id"] != loc {
				t.Errorf("Tasks collection = %v", col)
			}
			got, _ := e.svc.FirmwareVersion(tt.component)
			if tt.atOnce {
				_, _, mgr := e.do("GET", managerURI, nil, nil)
				if got != tt.version || mgr["FirmwareVersion"] != tt.version {
					t.Fatalf("BMC firmware %s, manager reports %v; want %s at once", got, mgr["FirmwareVersion"], tt.version)
				}
				return
			}
			if got != before || !maps.Equal(e.svc.PendingFirmware(), map[string]string{tt.component: tt.version}) {
				t.Fatalf("before the reset: running %s, pending %v", got, e.svc.PendingFirmware())
			}
			// Off and shutdown do not boot the host: still pending.
			if code, _, _ := e.do("POST", resetURI, map[string]string{"ResetType": "ForceOff"}, nil); code != http.StatusNoContent {
				t.Fatal("ForceOff failed")
			}
			if v, _ := e.svc.FirmwareVersion(tt.component); v != before {
				t.Fatalf("applied at ForceOff: %s", v)
			}
			if code, _, _ := e.do("POST", resetURI, map[string]string{"ResetType": "On"}, nil); code != http.StatusNoContent {
				t.Fatal("On failed")
			}
			_, _, inv := e.do("GET", firmwareURI+"/"+tt.component, nil, nil)
			if inv["Version"] != tt.version {
				t.Fatalf("inventory %s after the reset: %v, want %s", tt.component, inv["Version"], tt.version)
			}
			if tt.component == "BIOS" {
				_, _, sys := e.do("GET", systemURI, nil, nil)
				if sys["BiosVersion"] != tt.version {
					t.Fatalf("BiosVersion after the reset: %v, want %s", sys["BiosVersion"], tt.version)
				}
			}
			if p := e.svc.PendingFirmware(); len(p) != 0 {
				t.Fatalf("still pending after the reset: %v", p)
			}
		})
	}
}

// Bad images and targets are accepted (202, as real BMCs validate asynchronously) and end the
// task in Exception with a message; nothing is staged. Bad parameters are refused at once.
func TestSimpleUpdateFails(t *testing.T) {
	imgs, _ := serveImages(t, map[string][]byte{
		"/bios.img":  FirmwareImage("BIOS", "2.18.0"),
		"/other.img": FirmwareImage("CPLD", "9"),
		"/junk.img":  []byte("MZ this is a windows executable"),
		"/big.img":   append([]byte(firmwareMagic+"\n"), bytes.Repeat([]byte{'\n'}, maxFirmwareImage)...),
	})
	async := []struct {
		name    string
		quirk   bool
		body    map[string]any
		message string
	}{
		{"not a firmware image", false, map[string]any{"ImageURI": imgs + "/junk.img"}, "not a firmware image"},
		{"not found", false, map[string]any{"ImageURI": imgs + "/missing.img"}, "404"},
		{"too large", false, map[string]any{"ImageURI": imgs + "/big.img"}, "larger than"},
		{"component not in inventory", false, map[string]any{"ImageURI": imgs + "/other.img"}, "does not have"},
		{"component not among targets", false, map[string]any{"ImageURI": imgs + "/bios.img",
			"Targets": []string{firmwareURI + "/NIC.Slot.1-1-1"}}, "not among the targets"},
		{"target not in inventory", false, map[string]any{"ImageURI": imgs + "/bios.img",
			"Targets": []string{root + "/Systems/1"}}, "is not a member"},
		{"quirk FirmwareUpdateFails", true, map[string]any{"ImageURI": imgs + "/bios.img"}, "quirk"},
	}
	for _, tt := range async {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { dellLike(c); c.Quirks.FirmwareUpdateFails = tt.quirk })
			code, hdr, res := e.do("POST", simpleUpdateURI, tt.body, nil)
			if code != http.StatusAccepted || hdr.Get("Location") == "" {
				t.Fatalf("POST = %d %v, want 202 with a Location", code, res)
			}
			_, _, task := e.do("GET", hdr.Get("Location"), nil, nil)
			if task["TaskState"] != "Running" {
				t.Fatalf("first poll = %v, want Running", task["TaskState"])
			}
			_, _, task = e.do("GET", hdr.Get("Location"), nil, nil)
			msgs, _ := task["Messages"].([]any)
			if task["TaskState"] != "Exception" || len(msgs) == 0 ||
				!strings.Contains(msgs[0].(map[string]any)["Message"].(string), tt.message) {
				t.Fatalf("final poll = %v, want Exception saying %q", task, tt.message)
			}
			if p := e.svc.PendingFirmware(); len(p) != 0 {
				t.Fatalf("staged after a failed update: %v", p)
			}
		})
	}
	sync := []struct {
		name string
		body any
		id   string
	}{
		{"no ImageURI", map[string]any{"TransferProtocol": "HTTP"}, "Base.1.15.ActionParameterMissing"},
		{"TFTP", map[string]any{"ImageURI": imgs + "/bios.img", "TransferProtocol": "TFTP"}, "Base.1.15.ActionParameterNotSupported"},
		{"file URL", map[string]any{"ImageURI": "file:///etc/passwd"}, "Base.1.15.ActionParameterValueFormatError"},
		{"no scheme", map[string]any{"ImageURI": "10.0.0.1/bios.img"}, "Base.1.15.ActionParameterValueFormatError"},
		{"malformed", "not an object", "Base.1.15.MalformedJSON"},
	}
	for _, tt := range sync {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, dellLike)
			code, _, res := e.do("POST", simpleUpdateURI, tt.body, nil)
			if code != http.StatusBadRequest || messageID(res) != tt.id {
				t.Fatalf("POST = %d %s, want 400 %s", code, messageID(res), tt.id)
			}
		})
	}
}

// NoSimpleUpdate: the UpdateService lists no Actions and the action's URI is not served.
func TestNoSimpleUpdate(t *testing.T) {
	imgs, is := serveImages(t, map[string][]byte{"/bios.img": FirmwareImage("BIOS", "2")})
	e := newEnv(t, func(c *Config) { dellLike(c); c.Quirks.NoSimpleUpdate = true })
	_, _, us := e.do("GET", updateURI, nil, nil)
	if _, ok := us["Actions"]; ok {
		t.Fatalf("UpdateService lists Actions: %v", us["Actions"])
	}
	if code, _, _ := e.do("POST", simpleUpdateURI, map[string]any{"ImageURI": imgs + "/bios.img"}, nil); code != http.StatusNotFound {
		t.Fatalf("POST SimpleUpdate = %d, want 404", code)
	}
	if is.gets.Load() != 0 {
		t.Fatal("the image was fetched")
	}
	if code, _, _ := e.do("GET", tasksURI+"/1", nil, nil); code != http.StatusNotFound {
		t.Fatalf("GET a missing task = %d, want 404", code)
	}
	if code, _, _ := e.do("GET", tasksURI+"/../1", nil, nil); code != http.StatusNotFound {
		t.Fatalf("GET a bad task path = %d, want 404", code)
	}
}

func TestUpdatePollsRefused(t *testing.T) {
	if _, err := New(Config{Username: "u", Password: "p", UpdatePolls: -1}, nil); err == nil {
		t.Fatal("negative UpdatePolls accepted")
	}
}
