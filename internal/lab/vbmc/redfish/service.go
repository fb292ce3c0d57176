package redfishbmc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"bcd/internal/lab/vbmc"
)

const (
	root        = "/redfish/v1"
	updateURI   = root + "/UpdateService"
	firmwareURI = updateURI + "/FirmwareInventory"
	systemURI   = root + "/Systems/1"
	settingsURI = systemURI + "/Settings"
	resetURI    = systemURI + "/Actions/ComputerSystem.Reset"
	managerURI  = root + "/Managers/1"
	cdURI       = managerURI + "/VirtualMedia/CD1"
	accountURI  = root + "/AccountService/Accounts/1"
	sessionsURI = root + "/SessionService/Sessions"
	chassisURI  = root + "/Chassis/1"
)

// bootState is a ComputerSystem's Boot object, in Redfish's values.
type bootState struct {
	Enabled string // Disabled, Once, Continuous
	Target  string // None, Pxe, Hdd, Cd
	Mode    string // UEFI, Legacy
}

type session struct {
	id, token, user string
}

// Service is the virtual BMC. It is an http.Handler and safe for concurrent use.
type Service struct {
	cfg Config
	m   vbmc.Machine
	log *slog.Logger

	mu          sync.Mutex
	password    string
	boot        bootState
	pending     *bootState          // settings layout: written, applied at the next reset
	image       string              // inserted image URL
	bios        map[string]any      // current BIOS attributes (string, bool, json.Number, nil)
	biosPending map[string]any      // BIOS settings written, applied at the next reset that boots the host
	firmware    []FirmwareComponent // the inventory, with its running versions
	biosVersion string
	bmcVersion  string
	fwPending   map[string]string // component -> version, applied at the next reset that boots the host
	tasks       map[string]*fwTask
	nextTask    int
	sessions    map[string]session
	nextSess    int
	counts      map[string]int
	refused     map[string]int
}

// New returns a service for machine m.
func New(cfg Config, m vbmc.Machine) (*Service, error) {
	if cfg.Username == "" || cfg.Password == "" {
		return nil, errors.New("creating Redfish BMC: username and password are required")
	}
	switch cfg.Layout {
	case "":
		cfg.Layout = LayoutPlain
	case LayoutPlain, LayoutSettings:
	default:
		return nil, fmt.Errorf("creating Redfish BMC: unknown layout %q: accepted are plain, settings", cfg.Layout)
	}
	for _, rt := range cfg.Quirks.ResetTypes {
		if !slices.Contains(AllResetTypes(), rt) {
			return nil, fmt.Errorf("creating Redfish BMC: unsupported ResetType %q", rt)
		}
	}
	if cfg.Quirks.ResetTypes == nil {
		cfg.Quirks.ResetTypes = AllResetTypes()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Fetch == nil {
		cfg.Fetch = &http.Client{}
	}
	if cfg.UUID == "" {
		cfg.UUID = "00000000-0000-4000-8000-000000000001"
	}
	bios, err := initialBIOS(cfg.BIOSAttributes)
	if err != nil {
		return nil, fmt.Errorf("creating Redfish BMC: %w", err)
	}
	if cfg.UpdatePolls < 0 {
		return nil, fmt.Errorf("creating Redfish BMC: UpdatePolls %d is negative", cfg.UpdatePolls)
	}
	s := &Service{cfg: cfg, m: m, log: cfg.Log, password: cfg.Password, bios: bios,
		firmware: slices.Clone(cfg.Firmware), biosVersion: cfg.BiosVersion, bmcVersion: defaultBMCVersion,
		tasks:    map[string]*fwTask{},
		boot:     bootState{Enabled: "Disabled", Target: "None", Mode: "UEFI"},
		sessions: map[string]session{}, counts: map[string]int{}, refused: map[string]int{}}
	return s, nil
}

// Count returns how many requests of kind (KindReset, KindBoot, …) the service received,
// refused ones included.
func (s *Service) Count(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[kind]
}

// Classify names the kind of a request, for counters and Busy quirks.
func Classify(method, path string) string {
	path = strings.TrimSuffix(path, "/")
	switch {
	case method == http.MethodGet || method == http.MethodHead:
		return KindRead
	case method == http.MethodPost && path == resetURI:
		return KindReset
	case method == http.MethodPatch && (path == systemURI || path == settingsURI):
		return KindBoot
	case method == http.MethodPatch && (path == biosURI || path == biosSettingsURI):
		return KindBIOS
	case method == http.MethodPost && strings.HasPrefix(path, cdURI+"/Actions/"):
		return KindMedia
	case method == http.MethodPatch && strings.HasPrefix(path, root+"/AccountService/Accounts/"):
		return KindAccount
	case (method == http.MethodPost || method == http.MethodDelete) && strings.HasPrefix(path, sessionsURI):
		return KindSession
	case method == http.MethodPost && path == simpleUpdateURI:
		return KindUpdate
	}
	return KindOther
}

// statusRecorder keeps the status for the access log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// ServeHTTP serves the Redfish tree.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	user := s.serve(rec, r)
	s.log.DebugContext(r.Context(), "redfish request", "method", r.Method, "path", r.URL.Path,
		"status", rec.status, "user", user)
}

func (s *Service) serve(w http.ResponseWriter, r *http.Request) (user string) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	kind := Classify(r.Method, path)
	s.mu.Lock()
	s.counts[kind]++
	s.mu.Unlock()

	// Unauthenticated: the version document, the service root, and logging in.
	switch {
	case path == "/redfish" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"v1": "/redfish/v1/"})
		return ""
	case path == root && r.Method == http.MethodGet:
		s.writeResource(w, r, s.serviceRoot())
		return ""
	case path == sessionsURI && r.Method == http.MethodPost:
		if s.busy(w, kind) {
			return ""
		}
		s.createSession(w, r)
		return ""
	}
	user, ok := s.authenticate(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="bcd virtual BMC"`)
		writeError(w, http.StatusUnauthorized, "Base.1.15.InsufficientPrivilege",
			"There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.")
		return ""
	}
	if s.busy(w, kind) {
		return user
	}
	s.route(w, r, path, user)
	return user
}

// busy answers the request with the configured refusal while some remain for kind. Entries of
// one kind are served in order: the first Count refusals come from the first entry, and so on.
func (s *Service) busy(w http.ResponseWriter, kind string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	done := s.refused[kind]
	total := 0
	for _, b := range s.cfg.Quirks.Busy {
		if b.Kind != kind {
			continue
		}
		total += b.Count
		if done < total {
			s.refused[kind]++
			status := b.Status
			if status == 0 {
				status = http.StatusServiceUnavailable
			}
			if status == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			writeError(w, status, b.MessageID, "The request cannot be completed now: "+lastDotted(b.MessageID)+".")
			return true
		}
	}
	return false
}

func lastDotted(id string) string {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		return id[i+1:]
	}
	return id
}

func (s *Service) authenticate(r *http.Request) (string, bool) {
	if tok := r.Header.Get("X-Auth-Token"); tok != "" {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, ss := range s.sessions {
			if subtle.ConstantTimeCompare([]byte(ss.token), []byte(tok)) == 1 {
				return ss.user, true
			}
		}
		return "", false
	}
	u, p, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	return u, s.checkPassword(u, p)
}

func (s *Service) checkPassword(user, password string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	okUser := subtle.ConstantTimeCompare([]byte(user), []byte(s.cfg.Username)) == 1
	okPass := subtle.ConstantTimeCompare([]byte(password), []byte(s.password)) == 1
	return okUser && okPass
}

func (s *Service) createSession(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Quirks.NoSessions {
		writeError(w, http.StatusMethodNotAllowed, "Base.1.15.OperationNotAllowed", "Sessions are not supported.")
		return
	}
	var body struct {
		UserName string
		Password string
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	if !s.checkPassword(body.UserName, body.Password) {
		writeError(w, http.StatusUnauthorized, "Base.1.15.ResourceAtURIUnauthorized", "Invalid user name or password.")
		return
	}
	tok := randomHex(16)
	s.mu.Lock()
	s.nextSess++
	id := fmt.Sprint(s.nextSess)
	s.sessions[id] = session{id: id, token: tok, user: body.UserName}
	s.mu.Unlock()
	w.Header().Set("X-Auth-Token", tok)
	w.Header().Set("Location", sessionsURI+"/"+id)
	res := s.sessionResource(id, body.UserName)
	writeJSON(w, http.StatusCreated, res)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// route dispatches an authenticated request.
func (s *Service) route(w http.ResponseWriter, r *http.Request, path, user string) {
	ctx := r.Context()
	get := func(build func(context.Context) (map[string]any, error)) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, "Base.1.15.OperationNotAllowed", "The HTTP method is not allowed on this resource.")
			return
		}
		res, err := build(ctx)
		if errors.Is(err, errTaskMissing) {
			notFound(w, path)
			return
		}
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		s.writeResource(w, r, res)
	}
	static := func(res map[string]any) func(context.Context) (map[string]any, error) {
		return func(context.Context) (map[string]any, error) { return res, nil }
	}
	switch {
	case path == root+"/Systems":
		get(static(collection(root+"/Systems", "#ComputerSystemCollection.ComputerSystemCollection", "Computer System Collection", systemURI)))
	case path == systemURI && r.Method == http.MethodPatch:
		s.patchSystem(w, r, false)
	case path == systemURI:
		get(s.system)
	case path == settingsURI && s.cfg.Layout == LayoutSettings && r.Method == http.MethodPatch:
		s.patchSystem(w, r, true)
	case path == settingsURI && s.cfg.Layout == LayoutSettings:
		get(static(s.settingsResource()))
	case path == resetURI:
		s.reset(w, r)
	case path == biosURI && !s.cfg.Quirks.NoBIOS && r.Method != http.MethodGet && r.Method != http.MethodHead:
		writeError(w, http.StatusMethodNotAllowed, "Base.1.15.OperationNotAllowed",
			"The Bios resource is read-only: PATCH the resource named by @Redfish.Settings.SettingsObject.")
	case path == biosURI && !s.cfg.Quirks.NoBIOS:
		get(func(context.Context) (map[string]any, error) { return s.biosResource(), nil })
	case path == biosSettingsURI && !s.cfg.Quirks.NoBIOS && r.Method == http.MethodPatch:
		s.patchBIOSSettings(w, r)
	case path == biosSettingsURI && !s.cfg.Quirks.NoBIOS:
		get(func(context.Context) (map[string]any, error) { return s.biosSettingsResource(), nil })
	case path == systemURI+"/EthernetInterfaces":
		members := make([]string, len(s.cfg.MACs))
		for i := range s.cfg.MACs {
			members[i] = fmt.Sprintf("%s/EthernetInterfaces/%d", systemURI, i+1)
		}
		get(static(collection(path, "#EthernetInterfaceCollection.EthernetInterfaceCollection", "Ethernet Interface Collection", members...)))
	case strings.HasPrefix(path, systemURI+"/EthernetInterfaces/"):
		var n int
		if _, err := fmt.Sscanf(strings.TrimPrefix(path, systemURI+"/EthernetInterfaces/"), "%d", &n); err != nil || n < 1 || n > len(s.cfg.MACs) ||
			path != fmt.Sprintf("%s/EthernetInterfaces/%d", systemURI, n) {
			notFound(w, path)
			return
		}
		get(static(map[string]any{"@odata.id": path, "@odata.type": "#EthernetInterface.v1_6_0.EthernetInterface",
			"Id": fmt.Sprint(n), "Name": fmt.Sprintf("NIC %d", n), "MACAddress": s.cfg.MACs[n-1],
			"PermanentMACAddress": s.cfg.MACs[n-1], "InterfaceEnabled": true, "LinkStatus": "LinkUp",
			"Status": map[string]any{"State": "Enabled", "Health": "OK"}}))
	case path == root+"/Chassis":
		get(static(collection(path, "#ChassisCollection.ChassisCollection", "Chassis Collection", chassisURI)))
	case path == chassisURI:
		get(static(map[string]any{"@odata.id": chassisURI, "@odata.type": "#Chassis.v1_14_0.Chassis", "Id": "1",
			"Name": "Virtual Chassis", "ChassisType": "RackMount", "Manufacturer": s.cfg.Manufacturer, "Model": s.cfg.Model,
			"SerialNumber": s.cfg.SerialNumber, "Status": map[string]any{"State": "Enabled", "Health": "OK"},
			"Links": map[string]any{"ComputerSystems": []any{ref(systemURI)}, "ManagedBy": []any{ref(managerURI)}}}))
	case path == root+"/Managers":
		get(static(collection(path, "#ManagerCollection.ManagerCollection", "Manager Collection", managerURI)))
	case path == managerURI:
		bmcVersion, _ := s.FirmwareVersion(bmcComponent)
		get(static(map[string]any{"@odata.id": managerURI, "@odata.type": "#Manager.v1_10_0.Manager", "Id": "1",
			"Name": "Virtual BMC", "ManagerType": "BMC", "FirmwareVersion": bmcVersion,
			"Status":       map[string]any{"State": "Enabled", "Health": "OK"},
			"VirtualMedia": ref(managerURI + "/VirtualMedia"),
			"Links":        map[string]any{"ManagerForServers": []any{ref(systemURI)}, "ManagerForChassis": []any{ref(chassisURI)}}}))
	case path == managerURI+"/VirtualMedia":
		get(static(collection(path, "#VirtualMediaCollection.VirtualMediaCollection", "Virtual Media Collection", cdURI)))
	case path == cdURI:
		get(static(s.cdResource()))
	case path == cdURI+"/Actions/VirtualMedia.InsertMedia":
		s.insertMedia(w, r)
	case path == cdURI+"/Actions/VirtualMedia.EjectMedia":
		s.ejectMedia(w, r)
	case path == updateURI && !s.cfg.Quirks.NoUpdateService:
		get(static(s.updateServiceResource()))
	case path == simpleUpdateURI && !s.cfg.Quirks.NoUpdateService && !s.cfg.Quirks.NoSimpleUpdate:
		s.simpleUpdate(w, r)
	case path == taskServiceURI:
		get(static(s.taskServiceResource()))
	case path == tasksURI:
		get(static(s.tasksCollection()))
	case strings.HasPrefix(path, tasksURI+"/"):
		get(func(ctx context.Context) (map[string]any, error) {
			res, ok := s.taskResource(ctx, strings.TrimPrefix(path, tasksURI+"/"), r.Method == http.MethodGet)
			if !ok {
				return nil, errTaskMissing
			}
			return res, nil
		})
	case path == firmwareURI && !s.cfg.Quirks.NoUpdateService:
		inv := s.firmwareSnapshot()
		members := make([]string, len(inv))
		for i, f := range inv {
			members[i] = firmwareURI + "/" + f.ID
		}
		get(static(collection(path, "#SoftwareInventoryCollection.SoftwareInventoryCollection", "Firmware Collection", members...)))
	case strings.HasPrefix(path, firmwareURI+"/") && !s.cfg.Quirks.NoUpdateService:
		inv := s.firmwareSnapshot()
		i := slices.IndexFunc(inv, func(f FirmwareComponent) bool { return firmwareURI+"/"+f.ID == path })
		if i < 0 {
			notFound(w, path)
			return
		}
		f := inv[i]
		get(static(map[string]any{"@odata.id": path, "@odata.type": "#SoftwareInventory.v1_4_0.SoftwareInventory",
			"Id": f.ID, "Name": f.Name, "Version": f.Version, "Updateable": true,
			"Status": map[string]any{"State": "Enabled", "Health": "OK"}}))
	case path == root+"/SessionService":
		get(static(map[string]any{"@odata.id": path, "@odata.type": "#SessionService.v1_1_8.SessionService",
			"Id": "SessionService", "Name": "Session Service", "ServiceEnabled": !s.cfg.Quirks.NoSessions,
			"SessionTimeout": 600, "Sessions": ref(sessionsURI)}))
	case path == sessionsURI:
		s.mu.Lock()
		var ids []string
		for id := range s.sessions {
			ids = append(ids, sessionsURI+"/"+id)
		}
		s.mu.Unlock()
		slices.Sort(ids)
		get(static(collection(path, "#SessionCollection.SessionCollection", "Session Collection", ids...)))
	case strings.HasPrefix(path, sessionsURI+"/"):
		s.sessionItem(w, r, strings.TrimPrefix(path, sessionsURI+"/"))
	case path == root+"/AccountService":
		get(static(map[string]any{"@odata.id": path, "@odata.type": "#AccountService.v1_5_0.AccountService",
			"Id": "AccountService", "Name": "Account Service", "ServiceEnabled": true,
			"Accounts": ref(root + "/AccountService/Accounts")}))
	case path == root+"/AccountService/Accounts":
		get(static(collection(path, "#ManagerAccountCollection.ManagerAccountCollection", "Accounts Collection", accountURI)))
	case path == accountURI && r.Method == http.MethodPatch:
		s.patchAccount(w, r, user)
	case path == accountURI:
		get(static(s.accountResource()))
	default:
		notFound(w, path)
	}
}

func notFound(w http.ResponseWriter, path string) {
	writeError(w, http.StatusNotFound, "Base.1.15.ResourceMissingAtURI", "The resource at the URI "+path+" was not found.")
}

func (s *Service) internalError(w http.ResponseWriter, r *http.Request, err error) {
	s.log.ErrorContext(r.Context(), "redfish request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "Base.1.15.InternalError", "The request failed due to an internal service error: "+err.Error())
}

func ref(uri string) map[string]any { return map[string]any{"@odata.id": uri} }

func collection(uri, typ, name string, members ...string) map[string]any {
	ms := make([]any, len(members))
	for i, m := range members {
		ms[i] = ref(m)
	}
	return map[string]any{"@odata.id": uri, "@odata.type": typ, "Name": name, "Members": ms, "Members@odata.count": len(ms)}
}

func (s *Service) serviceRoot() map[string]any {
	res := map[string]any{"@odata.id": root + "/", "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
		"Id": "RootService", "Name": "Root Service", "RedfishVersion": "1.15.0", "UUID": s.cfg.UUID,
		"Product": "bcd virtual BMC", "Vendor": "bcd",
		"Systems": ref(root + "/Systems"), "Chassis": ref(root + "/Chassis"), "Managers": ref(root + "/Managers"),
		"SessionService": ref(root + "/SessionService"), "AccountService": ref(root + "/AccountService"),
		"Tasks": ref(taskServiceURI),
		"Links": map[string]any{"Sessions": ref(sessionsURI)}}
	if !s.cfg.Quirks.NoUpdateService {
		res["UpdateService"] = ref(updateURI)
	}
	return res
}

func bootJSON(b bootState) map[string]any {
	return map[string]any{"BootSourceOverrideEnabled": b.Enabled, "BootSourceOverrideTarget": b.Target,
		"BootSourceOverrideMode": b.Mode}
}

func (s *Service) system(ctx context.Context) (map[string]any, error) {
	on, err := s.m.PoweredOn(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading power: %w", err)
	}
	power := "Off"
	if on {
		power = "On"
	}
	s.mu.Lock()
	boot := bootJSON(s.boot)
	biosVersion := s.biosVersion
	s.mu.Unlock()
	boot["BootSourceOverrideTarget@Redfish.AllowableValues"] = []string{"None", "Pxe", "Hdd", "Cd"}
	boot["BootSourceOverrideMode@Redfish.AllowableValues"] = []string{"UEFI", "Legacy"}
	boot["BootSourceOverrideEnabled@Redfish.AllowableValues"] = []string{"Disabled", "Once", "Continuous"}
	res := map[string]any{"@odata.id": systemURI, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": "1", "Name": "Virtual Machine", "SystemType": "Physical", "UUID": s.cfg.UUID,
		"SerialNumber": s.cfg.SerialNumber, "Manufacturer": s.cfg.Manufacturer, "Model": s.cfg.Model,
		"PowerState": power, "Boot": boot, "BiosVersion": biosVersion,
		"Status":             map[string]any{"State": "Enabled", "Health": "OK"},
		"EthernetInterfaces": ref(systemURI + "/EthernetInterfaces"),
		"Links":              map[string]any{"Chassis": []any{ref(chassisURI)}, "ManagedBy": []any{ref(managerURI)}},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{"target": resetURI,
			"ResetType@Redfish.AllowableValues": s.cfg.Quirks.ResetTypes}}}
	if !s.cfg.Quirks.NoBIOS {
		res["Bios"] = ref(biosURI)
	}
	if s.cfg.Layout == LayoutSettings {
		res["@Redfish.Settings"] = map[string]any{"@odata.type": "#Settings.v1_3_5.Settings",
			"SettingsObject": ref(settingsURI), "SupportedApplyTimes": []string{"OnReset"}}
	}
	return res, nil
}

// settingsResource is the future state of the system: what applies at the next reset.
func (s *Service) settingsResource() map[string]any {
	s.mu.Lock()
	b := s.boot
	if s.pending != nil {
		b = *s.pending
	}
	s.mu.Unlock()
	return map[string]any{"@odata.id": settingsURI, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": "Settings", "Name": "Pending settings of Virtual Machine", "Boot": bootJSON(b)}
}

func (s *Service) cdResource() map[string]any {
	s.mu.Lock()
	image := s.image
	s.mu.Unlock()
	res := map[string]any{"@odata.id": cdURI, "@odata.type": "#VirtualMedia.v1_3_0.VirtualMedia", "Id": "CD1",
		"Name": "Virtual CD", "MediaTypes": []string{"CD", "DVD"}, "Inserted": image != "", "WriteProtected": true,
		"Image": nil, "ImageName": nil, "ConnectedVia": "NotConnected",
		"Actions": map[string]any{
			"#VirtualMedia.InsertMedia": map[string]any{"target": cdURI + "/Actions/VirtualMedia.InsertMedia"},
			"#VirtualMedia.EjectMedia":  map[string]any{"target": cdURI + "/Actions/VirtualMedia.EjectMedia"}}}
	if image != "" {
		res["Image"] = image
		res["ImageName"] = image[strings.LastIndexByte(image, '/')+1:]
		res["ConnectedVia"] = "URI"
	}
	return res
}

func (s *Service) accountResource() map[string]any {
	return map[string]any{"@odata.id": accountURI, "@odata.type": "#ManagerAccount.v1_7_0.ManagerAccount",
		"Id": "1", "Name": "User Account", "UserName": s.cfg.Username, "RoleId": "Administrator",
		"Enabled": true, "Locked": false, "Password": nil}
}

func (s *Service) sessionResource(id, user string) map[string]any {
	return map[string]any{"@odata.id": sessionsURI + "/" + id, "@odata.type": "#Session.v1_3_0.Session",
		"Id": id, "Name": "User Session", "UserName": user}
}

func (s *Service) sessionItem(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	ss, ok := s.sessions[id]
	if ok && r.Method == http.MethodDelete {
		delete(s.sessions, id)
	}
	s.mu.Unlock()
	switch {
	case !ok:
		notFound(w, r.URL.Path)
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet:
		s.writeResource(w, r, s.sessionResource(ss.id, ss.user))
	default:
		writeError(w, http.StatusMethodNotAllowed, "Base.1.15.OperationNotAllowed", "The HTTP method is not allowed on this resource.")
	}
}

// etagOf is the weak entity tag of a representation: a hash of its JSON.
func etagOf(res map[string]any) string {
	delete(res, "@odata.etag")
	b, _ := json.Marshal(res) // map keys are sorted: the hash is stable
	sum := sha256.Sum256(b)
	return `W/"` + hex.EncodeToString(sum[:8]) + `"`
}

func (s *Service) writeResource(w http.ResponseWriter, r *http.Request, res map[string]any) {
	tag := etagOf(res)
	res["@odata.etag"] = tag
	w.Header().Set("ETag", tag)
	w.Header().Set("OData-Version", "4.0")
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// ETagMatches reports whether an If-Match header value names tag (weak comparison; "*" matches).
func ETagMatches(ifMatch, tag string) bool {
	norm := func(t string) string { return strings.TrimPrefix(strings.TrimSpace(t), "W/") }
	for _, t := range strings.Split(ifMatch, ",") {
		if strings.TrimSpace(t) == "*" || norm(t) == norm(tag) {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers a Redfish error, with messageID in @Message.ExtendedInfo.
func writeError(w http.ResponseWriter, status int, messageID, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code": "Base.1.15.GeneralError", "message": message,
		"@Message.ExtendedInfo": []any{map[string]any{"@odata.type": "#Message.v1_1_1.Message",
			"MessageId": messageID, "Message": message, "Severity": "Warning", "Resolution": "Retry the operation."}}}})
}
