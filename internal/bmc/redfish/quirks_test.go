package redfish_test

// Tests against a small scripted Redfish BMC on loopback whose documents each test controls: the
// vendor quirks the virtual BMC of internal/lab does not imitate (missing PowerState, slow or
// transitional power states, reset types published only through @Redfish.ActionInfo, several
// ComputerSystems, virtual media under the system, sessions without a Location header).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"
)

// scripted is a Redfish BMC whose GET documents and POST/PATCH answers the test scripts. Its
// handlers run under mu: they may change test state without further locking.
type scripted struct {
	mu    sync.Mutex
	docs  map[string]func() (int, any)               // GET path -> status, body
	posts map[string]func(map[string]any) (int, any) // "POST path" -> status, body
	log   []string                                   // "METHOD path body [basic]"
	// session answers the session login: its Location header and body ("" for none).
	sessionLocation string
	sessionBody     string
}

func newScripted() *scripted {
	s := &scripted{docs: map[string]func() (int, any){}, posts: map[string]func(map[string]any) (int, any){},
		sessionLocation: "/redfish/v1/SessionService/Sessions/1", sessionBody: `{}`}
	s.docs["/redfish/v1"] = func() (int, any) {
		return 200, map[string]any{"@odata.id": "/redfish/v1/", "Systems": ref("/redfish/v1/Systems"),
			"Managers": ref("/redfish/v1/Managers"), "SessionService": ref("/redfish/v1/SessionService"),
			"Links": map[string]any{"Sessions": ref("/redfish/v1/SessionService/Sessions")}}
	}
	return s
}

func ref(u string) map[string]any { return map[string]any{"@odata.id": u} }

func redfishErr(status int, messageID string) (int, any) {
	return status, map[string]any{"error": map[string]any{"code": "Base.1.8.GeneralError", "message": messageID,
		"@Message.ExtendedInfo": []any{map[string]any{"MessageId": messageID, "Message": "refused: " + messageID}}}}
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := strings.TrimSuffix(r.URL.Path, "/")
	b, _ := io.ReadAll(r.Body)
	entry := r.Method + " " + path + " " + string(b)
	if _, _, ok := r.BasicAuth(); ok {
		entry += " [basic]"
	}
	s.log = append(s.log, entry)
	if r.Method == http.MethodPost && path == "/redfish/v1/SessionService/Sessions" {
		w.Header().Set("X-Auth-Token", "tok")
		if s.sessionLocation != "" {
			w.Header().Set("Location", s.sessionLocation)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(s.sessionBody))
		return
	}
	if r.Method == http.MethodDelete {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var st int
	var body any
	switch r.Method {
	case http.MethodGet:
		f, ok := s.docs[path]
		if !ok {
			st, body = redfishErr(404, "Base.1.8.ResourceMissingAtURI")
		} else {
			st, body = f()
		}
	default:
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		f, ok := s.posts[r.Method+" "+path]
		if !ok {
			st, body = redfishErr(405, "Base.1.8.ActionNotSupported")
		} else {
			st, body = f(m)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	if body != nil {
		_ = json.NewEncoder(w).Encode(body)
	}
}

// requests lists the logged requests starting with prefix.
func (s *scripted) requests(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.log {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (s *scripted) locked(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

func quirkOpts() redfish.Options {
	return redfish.Options{BackoffInitial: time.Millisecond, BackoffMax: 2 * time.Millisecond, MaxAttempts: 3,
		PollInterval: time.Millisecond, PowerOffWait: 5 * time.Second, SettleTimeout: 5 * time.Second}
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func dial(t *testing.T, url string, opts redfish.Options) *redfish.Client {
	t.Helper()
	c, err := redfish.New(ctx(t), bmc.Endpoint{Address: url, Username: "u", Password: "p"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

const (
	sys1      = "/redfish/v1/Systems/1"
	sys1Reset = sys1 + "/Actions/ComputerSystem.Reset"
)

// machine is the power side of a scripted ComputerSystem. A reset starts a transition that lasts
// lag reads of the system, during which the system reports during(from, to).
type machine struct {
	state   string   // reported PowerState when settled; "" means the property is absent
	allowed []string // ResetType@Redfish.AllowableValues; nil: not published
	info    string   // @Redfish.ActionInfo URI, "" for none
	refuse  map[string]string
	lag     int
	during  func(from, to string) string
	// onlyOnWhenOff refuses On while the system does not report Off (iLO, XCC).
	onlyOnWhenOff bool

	left int    // reads left in the current transition
	to   string // state the transition ends in
	sent []string
}

func transitionState(_, to string) string {
	if to == "Off" {
		return "PoweringOff"
	}
	return "PoweringOn"
}

func staleState(from, _ string) string { return from }

func (m *machine) reported() string {
	if m.left > 0 {
		return m.during(m.state, m.to)
	}
	return m.state
}

func (m *machine) doc() map[string]any {
	if m.left > 0 {
		m.left--
		if m.left == 0 {
			m.state = m.to
		}
	}
	reset := map[string]any{"target": sys1Reset}
	if m.allowed != nil {
		reset["ResetType@Redfish.AllowableValues"] = m.allowed
	}
	if m.info != "" {
		reset["@Redfish.ActionInfo"] = m.info
	}
	d := map[string]any{"@odata.id": sys1, "Actions": map[string]any{"#ComputerSystem.Reset": reset}}
	if st := m.reported(); st != "" {
		d["PowerState"] = st
	}
	return d
}

func (m *machine) reset(body map[string]any) (int, any) {
	rt, _ := body["ResetType"].(string)
	m.sent = append(m.sent, fmt.Sprintf("%s while %s", rt, m.reported()))
	if id, ok := m.refuse[rt]; ok {
		return redfishErr(400, id)
	}
	to := ""
	switch rt {
	case "On", "ForceOn":
		if m.onlyOnWhenOff && m.reported() != "Off" {
			return redfishErr(400, "Base.1.8.ActionNotSupported")
		}
		to = "On"
	case "ForceOff", "GracefulShutdown":
		to = "Off"
	case "PowerCycle", "ForceRestart":
		return 204, nil
	default:
		return redfishErr(400, "Base.1.8.ActionParameterValueNotInList")
	}
	if m.state == "" { // no PowerState reported: nothing to model
		return 204, nil
	}
	if m.lag == 0 {
		m.state = to
		return 204, nil
	}
	m.left, m.to = m.lag, to
	return 204, nil
}

// withMachine scripts a one-system BMC around m.
func withMachine(s *scripted, m *machine) {
	if m.during == nil {
		m.during = transitionState
	}
	s.docs["/redfish/v1/Systems"] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(sys1)}} }
	s.docs[sys1] = func() (int, any) { return 200, m.doc() }
	s.posts["POST "+sys1Reset] = m.reset
}

// TestPowerUnknownState: a system without PowerState (optional in the schema) gets the reset the
// action needs instead of being taken for off.
func TestPowerUnknownState(t *testing.T) {
	noCycle := []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart"}
	tests := []struct {
		action  bmc.PowerAction
		allowed []string
		want    []string
	}{
		{bmc.ActionOn, nil, []string{"On while "}},
		{bmc.ActionOff, nil, []string{"ForceOff while "}},
		{bmc.ActionSoft, nil, []string{"GracefulShutdown while "}},
		{bmc.ActionCycle, nil, []string{"PowerCycle while "}},
		{bmc.ActionReset, nil, []string{"PowerCycle while "}},
		{bmc.ActionCycle, noCycle, []string{"ForceOff while ", "On while "}},
		{bmc.ActionReset, noCycle, []string{"ForceOff while ", "On while "}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d-types", tt.action, len(tt.allowed)), func(t *testing.T) {
			s := newScripted()
			m := &machine{allowed: tt.allowed}
			withMachine(s, m)
			c := dial(t, serve(t, s), quirkOpts())
			if err := c.SetPower(ctx(t), tt.action); err != nil {
				t.Fatalf("SetPower: %v", err)
			}
			s.locked(func() {
				if !slices.Equal(m.sent, tt.want) {
					t.Errorf("resets %q, want %q", m.sent, tt.want)
				}
			})
			if p, err := c.GetPower(ctx(t)); err != nil || p != bmc.PowerUnknown {
				t.Errorf("GetPower = %s, %v; want unknown", p, err)
			}
		})
	}
}

// TestPowerTransitions: the ForceOff-then-On fallback waits for Off itself (not PoweringOff, during
// which iLO and XCC refuse On), a system found in transition is waited out before planning, and
// on/off wait until the BMC reports the new state, so that the next read is not stale.
func TestPowerTransitions(t *testing.T) {
	noCycle := []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart"}
	tests := []struct {
		name      string
		m         machine
		inFlight  string // a transition under way when SetPower starts: its target state
		action    bmc.PowerAction
		settle    time.Duration // SettleTimeout; 0: quirkOpts'
		wantSent  []string
		wantState string         // settled state after the action
		wantPower bmc.PowerState // GetPower right after SetPower
	}{
		{name: "cycle without PowerCycle waits for Off, not PoweringOff",
			m:      machine{state: "On", allowed: noCycle, lag: 6, onlyOnWhenOff: true},
			action: bmc.ActionCycle, wantSent: []string{"ForceOff while On", "On while Off"}, wantState: "On", wantPower: bmc.PowerOn},
		{name: "reset without PowerCycle or ForceRestart waits for Off",
			m:      machine{state: "On", allowed: []string{"On", "ForceOff"}, lag: 4, onlyOnWhenOff: true},
			action: bmc.ActionReset, wantSent: []string{"ForceOff while On", "On while Off"}, wantState: "On", wantPower: bmc.PowerOn},
		{name: "powering off: on waits for Off, then powers on",
			m:        machine{state: "On", lag: 4, onlyOnWhenOff: true},
			inFlight: "Off", action: bmc.ActionOn, wantSent: []string{"On while Off"}, wantState: "On", wantPower: bmc.PowerOn},
		{name: "powering on: off waits for On, then powers off",
			m:        machine{state: "Off", lag: 4},
			inFlight: "On", action: bmc.ActionOff, wantSent: []string{"ForceOff while On"}, wantState: "Off", wantPower: bmc.PowerOff},
		{name: "powering off: off waits and sends nothing",
			m:        machine{state: "On", lag: 3},
			inFlight: "Off", action: bmc.ActionOff, wantSent: nil, wantState: "Off", wantPower: bmc.PowerOff},
		{name: "off settles: stale On for a few reads",
			m:      machine{state: "On", lag: 4, during: staleState},
			action: bmc.ActionOff, wantSent: []string{"ForceOff while On"}, wantState: "Off", wantPower: bmc.PowerOff},
		{name: "on settles: stale Off for a few reads",
			m:      machine{state: "Off", lag: 4, during: staleState},
			action: bmc.ActionOn, wantSent: []string{"On while Off"}, wantState: "On", wantPower: bmc.PowerOn},
		{name: "on does not settle in time: no error, the read state is reported",
			m:      machine{state: "Off", lag: 1 << 30, during: staleState},
			action: bmc.ActionOn, settle: 30 * time.Millisecond, wantSent: []string{"On while Off"}, wantState: "Off", wantPower: bmc.PowerOff},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScripted()
			m := tt.m
			withMachine(s, &m)
			if tt.inFlight != "" {
				m.left, m.to = m.lag, tt.inFlight
			}
			opts := quirkOpts()
			if tt.settle > 0 {
				opts.SettleTimeout = tt.settle
			}
			c := dial(t, serve(t, s), opts)
			if err := c.SetPower(ctx(t), tt.action); err != nil {
				t.Fatalf("SetPower: %v", err)
			}
			p, err := c.GetPower(ctx(t))
			if err != nil || p != tt.wantPower {
				t.Errorf("GetPower right after = %s, %v; want %s", p, err, tt.wantPower)
			}
			s.locked(func() {
				if !slices.Equal(m.sent, tt.wantSent) {
					t.Errorf("resets %q, want %q", m.sent, tt.wantSent)
				}
				if m.state != tt.wantState {
					t.Errorf("machine %s, want %s", m.state, tt.wantState)
				}
			})
		})
	}
}

// TestResetTypesFromActionInfo: reset types published only through @Redfish.ActionInfo are used,
// and a PowerCycle the BMC refuses as not supported falls back to ForceOff, wait for Off, On.
func TestResetTypesFromActionInfo(t *testing.T) {
	const info = sys1 + "/ResetActionInfo"
	infoDoc := func(values ...string) func() (int, any) {
		return func() (int, any) {
			return 200, map[string]any{"Parameters": []any{
				map[string]any{"Name": "Other", "AllowableValues": []string{"PowerCycle"}},
				map[string]any{"Name": "ResetType", "Required": true, "AllowableValues": values}}}
		}
	}
	tests := []struct {
		name      string
		info      func() (int, any) // nil: the ActionInfo URI answers 404
		refuse    map[string]string
		action    bmc.PowerAction
		wantSent  []string
		wantInfo  int // ActionInfo reads
		wantError bool
	}{
		{name: "ActionInfo without PowerCycle", info: infoDoc("On", "ForceOff", "GracefulShutdown", "ForceRestart"),
			action: bmc.ActionCycle, wantSent: []string{"ForceOff while On", "On while Off"}, wantInfo: 1},
		{name: "ActionInfo with PowerCycle", info: infoDoc("On", "ForceOff", "PowerCycle"),
			action: bmc.ActionCycle, wantSent: []string{"PowerCycle while On"}, wantInfo: 1},
		{name: "ActionInfo without GracefulShutdown refuses soft", info: infoDoc("On", "ForceOff"),
			action: bmc.ActionSoft, wantInfo: 1, wantError: true},
		{name: "unreadable ActionInfo: defaults, PowerCycle refused as not supported",
			refuse: map[string]string{"PowerCycle": "Base.1.8.ActionParameterNotSupported"},
			action: bmc.ActionCycle, wantSent: []string{"PowerCycle while On", "ForceOff while On", "On while Off"}, wantInfo: 1},
		{name: "ForceRestart refused as value not in list",
			info:   infoDoc("On", "ForceOff", "ForceRestart"),
			refuse: map[string]string{"ForceRestart": "Base.1.8.ActionParameterValueNotInList"},
			action: bmc.ActionReset, wantSent: []string{"ForceRestart while On", "ForceOff while On", "On while Off"}, wantInfo: 1},
		{name: "PowerCycle refused for another reason is an error",
			info:   infoDoc("On", "ForceOff", "PowerCycle"),
			refuse: map[string]string{"PowerCycle": "Base.1.8.InternalError"},
			action: bmc.ActionCycle, wantSent: []string{"PowerCycle while On"}, wantInfo: 1, wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScripted()
			m := &machine{state: "On", info: info, refuse: tt.refuse, lag: 3, onlyOnWhenOff: true}
			withMachine(s, m)
			if tt.info != nil {
				s.docs[info] = tt.info
			}
			c := dial(t, serve(t, s), quirkOpts())
			err := c.SetPower(ctx(t), tt.action)
			if (err != nil) != tt.wantError {
				t.Fatalf("SetPower: %v, want error %v", err, tt.wantError)
			}
			s.locked(func() {
				if !slices.Equal(m.sent, tt.wantSent) {
					t.Errorf("resets %q, want %q", m.sent, tt.wantSent)
				}
			})
			if n := len(s.requests("GET " + info)); n != tt.wantInfo {
				t.Errorf("ActionInfo read %d times, want %d", n, tt.wantInfo)
			}
		})
	}
}

// TestSystemSelection: with several ComputerSystems (HGX baseboards, partitions) the driver takes
// the physical one, else the one a manager serves, reads every page of the collection, and fails
// naming the candidates rather than guess.
func TestSystemSelection(t *testing.T) {
	type system struct {
		id, systemType string
	}
	tests := []struct {
		name     string
		pages    [][]string // Systems collection pages, linked by Members@odata.nextLink
		systems  []system
		managers map[string][]string // manager id -> ManagerForServers
		want     string              // chosen system id; "" for an error
	}{
		{name: "only one", pages: [][]string{{"A"}}, systems: []system{{"A", ""}}, want: "A"},
		{name: "the physical one", pages: [][]string{{"HGX_Baseboard_0", "System_0"}},
			systems: []system{{"HGX_Baseboard_0", "PhysicallyPartitioned"}, {"System_0", "Physical"}}, want: "System_0"},
		{name: "the one the manager serves", pages: [][]string{{"HGX_Baseboard_0", "System_0"}},
			systems:  []system{{"HGX_Baseboard_0", "Physical"}, {"System_0", "Physical"}},
			managers: map[string][]string{"bmc": {"System_0"}}, want: "System_0"},
		{name: "on the second page", pages: [][]string{{"Virtual_0"}, {"System_0"}},
			systems: []system{{"Virtual_0", "Virtual"}, {"System_0", "Physical"}}, want: "System_0"},
		{name: "ambiguous", pages: [][]string{{"HGX_Baseboard_0", "System_0"}},
			systems:  []system{{"HGX_Baseboard_0", ""}, {"System_0", ""}},
			managers: map[string][]string{"bmc": {"System_0"}, "hgx": {"HGX_Baseboard_0"}}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScripted()
			for i, page := range tt.pages {
				var members []any
				for _, id := range page {
					members = append(members, ref("/redfish/v1/Systems/"+id))
				}
				doc := map[string]any{"Members": members}
				if i+1 < len(tt.pages) {
					doc["Members@odata.nextLink"] = fmt.Sprintf("/redfish/v1/Systems?$skip=%d", i+1)
				}
				path := "/redfish/v1/Systems"
				if i > 0 {
					path = fmt.Sprintf("/redfish/v1/Systems?$skip=%d", i)
				}
				s.docs[path] = func() (int, any) { return 200, doc }
			}
			for _, sys := range tt.systems {
				uri := "/redfish/v1/Systems/" + sys.id
				s.docs[uri] = func() (int, any) {
					return 200, map[string]any{"@odata.id": uri, "SystemType": sys.systemType, "PowerState": "On", "UUID": sys.id,
						"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{"target": uri + "/Actions/ComputerSystem.Reset"}}}
				}
				s.posts["POST "+uri+"/Actions/ComputerSystem.Reset"] = func(map[string]any) (int, any) { return 204, nil }
			}
			var mgrs []any
			for id, servers := range tt.managers {
				uri := "/redfish/v1/Managers/" + id
				mgrs = append(mgrs, ref(uri))
				var links []any
				for _, srv := range servers {
					links = append(links, ref("/redfish/v1/Systems/"+srv))
				}
				s.docs[uri] = func() (int, any) {
					return 200, map[string]any{"@odata.id": uri, "Links": map[string]any{"ManagerForServers": links}}
				}
			}
			s.docs["/redfish/v1/Managers"] = func() (int, any) { return 200, map[string]any{"Members": mgrs} }
			h := http.Handler(s)
			if len(tt.pages) > 1 { // route the query string into the path the script knows
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.RawQuery != "" {
						r.URL.Path += "?" + r.URL.RawQuery
					}
					s.ServeHTTP(w, r)
				})
			}
			c := dial(t, serve(t, h), quirkOpts())
			inv, err := c.Inspect(ctx(t))
			if tt.want == "" {
				if err == nil {
					t.Fatalf("Inspect chose %q among ambiguous systems", inv.SystemUUID)
				}
				for _, sys := range tt.systems {
					if !strings.Contains(err.Error(), "/redfish/v1/Systems/"+sys.id) {
						t.Errorf("error %q does not name candidate %s", err, sys.id)
					}
				}
				if err := c.SetPower(ctx(t), bmc.ActionReset); err == nil || len(s.requests("POST /redfish/v1/Systems")) != 0 {
					t.Errorf("SetPower on an ambiguous BMC: %v, resets %q", err, s.requests("POST /redfish/v1/Systems"))
				}
				return
			}
			if err != nil || inv.SystemUUID != strings.ToLower(tt.want) {
				t.Fatalf("Inspect = %q, %v; want system %s", inv.SystemUUID, err, tt.want)
			}
			if err := c.SetPower(ctx(t), bmc.ActionReset); err != nil {
				t.Fatal(err)
			}
			want := "POST /redfish/v1/Systems/" + tt.want + "/Actions/ComputerSystem.Reset"
			if got := s.requests("POST /redfish/v1/Systems"); len(got) != 1 || !strings.HasPrefix(got[0], want) {
				t.Errorf("resets %q, want one %s", got, want)
			}
		})
	}
}

// TestVirtualMediaLocations: the CD is looked for under the ComputerSystem first (iDRAC10, Lenovo
// XCC), then under the managers.
func TestVirtualMediaLocations(t *testing.T) {
	const (
		sysVM = sys1 + "/VirtualMedia"
		mgr   = "/redfish/v1/Managers/1"
		mgrVM = mgr + "/VirtualMedia"
	)
	media := func(s *scripted, collection string, types ...string) {
		uri := collection + "/1"
		s.docs[collection] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(uri)}} }
		s.docs[uri] = func() (int, any) {
			return 200, map[string]any{"@odata.id": uri, "MediaTypes": types, "Inserted": false,
				"Actions": map[string]any{"#VirtualMedia.InsertMedia": map[string]any{"target": uri + "/Actions/VirtualMedia.InsertMedia"}}}
		}
		s.posts["POST "+uri+"/Actions/VirtualMedia.InsertMedia"] = func(map[string]any) (int, any) { return 204, nil }
	}
	tests := []struct {
		name      string
		systemVM  []string // media types under the system; nil: no VirtualMedia link there
		managerVM []string // media types under the manager; nil: none
		want      string   // collection whose media gets the insert; "" for an error
	}{
		{"under the system only", []string{"CD", "DVD", "USBStick"}, nil, sysVM},
		{"under the manager only", nil, []string{"CD"}, mgrVM},
		{"both: the system's first", []string{"DVD"}, []string{"CD"}, sysVM},
		{"no CD under the system", []string{"USBStick"}, []string{"CD"}, mgrVM},
		{"none at all", []string{"USBStick"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScripted()
			sysDoc := map[string]any{"@odata.id": sys1, "PowerState": "On",
				"Links": map[string]any{"ManagedBy": []any{ref(mgr)}}}
			mgrDoc := map[string]any{"@odata.id": mgr}
			if tt.systemVM != nil {
				sysDoc["VirtualMedia"] = ref(sysVM)
				media(s, sysVM, tt.systemVM...)
			}
			if tt.managerVM != nil {
				mgrDoc["VirtualMedia"] = ref(mgrVM)
				media(s, mgrVM, tt.managerVM...)
			}
			s.docs["/redfish/v1/Systems"] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(sys1)}} }
			s.docs[sys1] = func() (int, any) { return 200, sysDoc }
			s.docs[mgr] = func() (int, any) { return 200, mgrDoc }
			c := dial(t, serve(t, s), quirkOpts())
			err := c.InsertMedia(ctx(t), "http://192.0.2.1/x.iso")
			var inserts []string
			for _, r := range s.requests("POST /redfish/v1/") {
				if strings.Contains(r, "InsertMedia") {
					inserts = append(inserts, r)
				}
			}
			if tt.want == "" {
				if err == nil || !strings.Contains(err.Error(), "no CD/DVD") {
					t.Fatalf("InsertMedia = %v, want a no-CD error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("InsertMedia: %v", err)
			}
			if len(inserts) != 1 || !strings.HasPrefix(inserts[0], "POST "+tt.want+"/1/Actions/VirtualMedia.InsertMedia") {
				t.Errorf("inserts %q, want one under %s", inserts, tt.want)
			}
		})
	}
}

// TestSessionLogout: a session is logged out with the URI the BMC gave, from the Location header or
// else the body's @odata.id; a BMC that names neither gets basic auth from then on, for the clients
// that share a session memory, instead of one leaked session per operation.
func TestSessionLogout(t *testing.T) {
	tests := []struct {
		name         string
		location     string
		body         string
		noMemory     bool     // the clients share no SessionMemory
		wantSessions int      // sessions created over three clients
		wantDeletes  []string // DELETE requests
		wantBasic    bool     // the later clients authenticate with basic auth
	}{
		{"Location header", "/redfish/v1/SessionService/Sessions/1", `{}`, false, 3,
			[]string{"DELETE /redfish/v1/SessionService/Sessions/1 ", "DELETE /redfish/v1/SessionService/Sessions/1 ", "DELETE /redfish/v1/SessionService/Sessions/1 "}, false},
		{"absolute Location header", "http://192.0.2.1/redfish/v1/SessionService/Sessions/2", `{}`, false, 3,
			[]string{"DELETE /redfish/v1/SessionService/Sessions/2 ", "DELETE /redfish/v1/SessionService/Sessions/2 ", "DELETE /redfish/v1/SessionService/Sessions/2 "}, false},
		{"@odata.id in the body", "", `{"@odata.id":"/redfish/v1/SessionService/Sessions/7","Id":"7"}`, false, 3,
			[]string{"DELETE /redfish/v1/SessionService/Sessions/7 ", "DELETE /redfish/v1/SessionService/Sessions/7 ", "DELETE /redfish/v1/SessionService/Sessions/7 "}, false},
		{"neither", "", `{"Id":"7"}`, false, 1, nil, true},
		{"neither, no shared memory: each client tries a session", "", `{"Id":"7"}`, true, 3, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScripted()
			s.sessionLocation, s.sessionBody = tt.location, tt.body
			withMachine(s, &machine{state: "On"})
			url := serve(t, s)
			opts := quirkOpts()
			if !tt.noMemory {
				opts.Sessions = &redfish.SessionMemory{}
			}
			for i := range 3 {
				c, err := redfish.New(ctx(t), bmc.Endpoint{Address: url, Username: "u", Password: "p"}, opts)
				if err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				if _, err := c.GetPower(ctx(t)); err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				_ = c.Close(ctx(t))
			}
			if n := len(s.requests("POST /redfish/v1/SessionService/Sessions")); n != tt.wantSessions {
				t.Errorf("%d sessions created, want %d", n, tt.wantSessions)
			}
			if got := s.requests("DELETE"); !slices.Equal(got, tt.wantDeletes) {
				t.Errorf("deletes %q, want %q", got, tt.wantDeletes)
			}
			reads := s.requests("GET " + sys1)
			if basic := strings.HasSuffix(reads[len(reads)-1], "[basic]"); basic != tt.wantBasic {
				t.Errorf("last read with basic auth = %v, want %v (%q)", basic, tt.wantBasic, reads)
			}
		})
	}
}
