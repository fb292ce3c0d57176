package redfishbmc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Boot targets in Redfish's words and the machine's.
func machineDevice(target string) (string, bool) {
	switch target {
	case "Pxe":
		return "pxe", true
	case "Hdd":
		return "disk", true
	case "Cd":
		return "cd", true
	}
	return "", false
}

// ApplyBootPatch merges a PATCH's Boot object into cur, validating every value. It is pure.
func ApplyBootPatch(cur bootState, patch map[string]any) (bootState, error) {
	next := cur
	for k, v := range patch {
		str, ok := v.(string)
		if !ok {
			return cur, fmt.Errorf("PropertyValueTypeError:%s", k)
		}
		switch k {
		case "BootSourceOverrideEnabled":
			if !slices.Contains([]string{"Disabled", "Once", "Continuous"}, str) {
				return cur, fmt.Errorf("PropertyValueNotInList:%s", k)
			}
			next.Enabled = str
		case "BootSourceOverrideTarget":
			if !slices.Contains([]string{"None", "Pxe", "Hdd", "Cd"}, str) {
				return cur, fmt.Errorf("PropertyValueNotInList:%s", k)
			}
			next.Target = str
		case "BootSourceOverrideMode":
			if !slices.Contains([]string{"UEFI", "Legacy"}, str) {
				return cur, fmt.Errorf("PropertyValueNotInList:%s", k)
			}
			next.Mode = str
		default:
			return cur, fmt.Errorf("PropertyUnknown:%s", k)
		}
	}
	if next.Target == "None" {
		next.Enabled = "Disabled"
	}
	return next, nil
}

func writePatchError(w http.ResponseWriter, err error) {
	id, prop, _ := strings.Cut(err.Error(), ":")
	writeError(w, http.StatusBadRequest, "Base.1.15."+id, fmt.Sprintf("The property %s is not accepted (%s).", prop, id))
}

// patchSystem handles a PATCH of the system (toSettings false) or of its SettingsObject.
func (s *Service) patchSystem(w http.ResponseWriter, r *http.Request, toSettings bool) {
	ctx := r.Context()
	var body map[string]json.RawMessage
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	// The current representation decides If-Match.
	var cur map[string]any
	if toSettings {
		cur = s.settingsResource()
	} else {
		var err error
		if cur, err = s.system(ctx); err != nil {
			s.internalError(w, r, err)
			return
		}
	}
	ifMatch := r.Header.Get("If-Match")
	if ifMatch == "" && toSettings {
		writeError(w, http.StatusPreconditionRequired, "Base.1.15.PreconditionRequired",
			"A precondition header (If-Match) is required for this resource.")
		return
	}
	if ifMatch != "" && !ETagMatches(ifMatch, etagOf(cur)) {
		writeError(w, http.StatusPreconditionFailed, "Base.1.15.PreconditionFailed",
			"The ETag supplied did not match the ETag required to change this resource.")
		return
	}
	for k := range body {
		if k != "Boot" && !strings.HasPrefix(k, "@odata.") {
			writeError(w, http.StatusBadRequest, "Base.1.15.PropertyNotWritable", "The property "+k+" is a read only property and cannot be assigned a value.")
			return
		}
	}
	var bootPatch map[string]any
	if raw, ok := body["Boot"]; ok {
		if err := json.Unmarshal(raw, &bootPatch); err != nil {
			writeError(w, http.StatusBadRequest, "Base.1.15.PropertyValueTypeError", "The value of Boot is not an object.")
			return
		}
	}
	if !toSettings && s.cfg.Layout == LayoutSettings && len(bootPatch) > 0 {
		writeError(w, http.StatusBadRequest, "Base.1.15.PropertyNotWritable",
			"Boot cannot be changed here: PATCH the resource named by @Redfish.Settings.SettingsObject.")
		return
	}
	s.mu.Lock()
	base := s.boot
	if toSettings && s.pending != nil {
		base = *s.pending
	}
	s.mu.Unlock()
	next, err := ApplyBootPatch(base, bootPatch)
	if err != nil {
		writePatchError(w, err)
		return
	}
	if s.cfg.Quirks.IgnoreBootOverride {
		s.log.InfoContext(ctx, "redfish boot override ignored (quirk)")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if next.Enabled != "Disabled" {
		dev, _ := machineDevice(next.Target)
		// QEMU applies boot order at the next reset: writing it now is right for both layouts.
		if err := s.m.SetBootDevice(ctx, dev); err != nil {
			s.internalError(w, r, err)
			return
		}
	}
	s.mu.Lock()
	if toSettings {
		s.pending = &next
	} else {
		s.boot = next
	}
	s.mu.Unlock()
	s.log.InfoContext(ctx, "redfish boot override set", "enabled", next.Enabled, "target", next.Target,
		"mode", next.Mode, "pending", toSettings)
	w.WriteHeader(http.StatusNoContent)
}

// afterReset applies pending settings, and ends a one-time override, as a BMC does when the
// host restarts.
func (s *Service) afterReset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != nil {
		s.boot = *s.pending
		s.pending = nil
	}
	if s.boot.Enabled == "Once" {
		s.boot.Enabled = "Disabled"
	}
}

func (s *Service) reset(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "Base.1.15.OperationNotAllowed", "The HTTP method is not allowed on this resource.")
		return
	}
	var body struct{ ResetType string }
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	if body.ResetType == "" {
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterMissing", "The action ComputerSystem.Reset requires the parameter ResetType.")
		return
	}
	if !slices.Contains(s.cfg.Quirks.ResetTypes, body.ResetType) {
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterNotSupported",
			fmt.Sprintf("The parameter ResetType value %s is not supported by this service.", body.ResetType))
		return
	}
	if err := s.doReset(ctx, body.ResetType); err != nil {
		s.internalError(w, r, err)
		return
	}
	s.log.InfoContext(ctx, "redfish reset", "type", body.ResetType)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) doReset(ctx context.Context, resetType string) error {
	on, err := s.m.PoweredOn(ctx)
	if err != nil {
		return fmt.Errorf("reading power: %w", err)
	}
	switch resetType {
	case "On":
		if on {
			return nil
		}
		err = s.m.PowerOn(ctx)
	case "ForceOff":
		return s.m.PowerOff(ctx)
	case "GracefulShutdown":
		return s.m.Shutdown(ctx)
	case "ForceRestart":
		if !on {
			err = s.m.PowerOn(ctx)
		} else {
			err = s.m.Reset(ctx)
		}
	case "PowerCycle":
		if on {
			if err = s.m.PowerOff(ctx); err != nil {
				return err
			}
		}
		err = s.m.PowerOn(ctx)
	default:
		return fmt.Errorf("unsupported reset type %s", resetType)
	}
	if err == nil {
		s.afterReset()
		// Every reset that gets here starts the host (ForceOff and GracefulShutdown returned
		// above, as did On on a running host): its firmware applies the pending BIOS settings.
		if applied := s.applyBIOSSettings(ctx); len(applied) > 0 {
			s.log.InfoContext(ctx, "redfish BIOS settings applied at reset", "type", resetType, "attributes", applied)
		}
		if updated := s.applyFirmware(); len(updated) > 0 {
			s.log.InfoContext(ctx, "redfish staged firmware applied at reset", "type", resetType, "components", updated)
		}
	}
	return err
}

func (s *Service) insertMedia(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var body struct {
		Image          string
		Inserted       *bool
		WriteProtected *bool
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	u, err := url.Parse(body.Image)
	if body.Image == "" || err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterMissing", "The action VirtualMedia.InsertMedia requires the parameter Image.")
		return
	}
	var local string
	switch {
	case u.Scheme == "file" && s.cfg.AllowFileImages:
		local = u.Path
		if _, err := os.Stat(local); err != nil {
			writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterValueFormatError", "The image "+body.Image+" cannot be read.")
			return
		}
	case u.Scheme == "http" || u.Scheme == "https":
		local, err = s.fetch(ctx, u)
		if err != nil {
			writeError(w, http.StatusBadRequest, "Base.1.15.GeneralError",
				"Fetching the image failed: "+err.Error())
			return
		}
	default:
		writeError(w, http.StatusBadRequest, "Base.1.15.ActionParameterValueFormatError",
			"The image URL scheme "+u.Scheme+" is not supported.")
		return
	}
	if err := s.m.InsertMedia(ctx, local); err != nil {
		s.internalError(w, r, err)
		return
	}
	s.mu.Lock()
	s.image = body.Image
	s.mu.Unlock()
	s.log.InfoContext(ctx, "redfish media inserted", "image", u.Redacted())
	w.WriteHeader(http.StatusNoContent)
}

// fetch downloads an image into MediaDir.
func (s *Service) fetch(ctx context.Context, u *url.URL) (string, error) {
	if s.cfg.MediaDir == "" {
		return "", fmt.Errorf("no media directory configured")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", err
	}
	resp, err := s.cfg.Fetch.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	name := filepath.Base(u.Path)
	if name == "." || name == "/" || name == "" {
		name = "image.iso"
	}
	f, err := os.CreateTemp(s.cfg.MediaDir, "*-"+name)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

func (s *Service) ejectMedia(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if err := s.m.EjectMedia(ctx); err != nil {
		s.internalError(w, r, err)
		return
	}
	s.mu.Lock()
	s.image = ""
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// patchAccount changes the password of the logged-in account.
func (s *Service) patchAccount(w http.ResponseWriter, r *http.Request, user string) {
	var body map[string]json.RawMessage
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	if user != s.cfg.Username {
		writeError(w, http.StatusForbidden, "Base.1.15.InsufficientPrivilege", "Only the account's own user may change its password.")
		return
	}
	if ifMatch := r.Header.Get("If-Match"); ifMatch != "" && !ETagMatches(ifMatch, etagOf(s.accountResource())) {
		writeError(w, http.StatusPreconditionFailed, "Base.1.15.PreconditionFailed",
			"The ETag supplied did not match the ETag required to change this resource.")
		return
	}
	var password string
	for k, v := range body {
		if k != "Password" {
			writeError(w, http.StatusBadRequest, "Base.1.15.PropertyNotWritable", "The property "+k+" cannot be changed here.")
			return
		}
		if err := json.Unmarshal(v, &password); err != nil || len(password) < 8 {
			writeError(w, http.StatusBadRequest, "Base.1.15.PropertyValueFormatError",
				"The value for the property Password is not accepted: at least 8 characters are required.")
			return
		}
	}
	if password == "" {
		writeError(w, http.StatusBadRequest, "Base.1.15.PropertyMissing", "The property Password is required.")
		return
	}
	s.mu.Lock()
	s.password = password
	s.mu.Unlock()
	s.log.InfoContext(r.Context(), "redfish account password changed", "user", user)
	w.WriteHeader(http.StatusNoContent)
}
