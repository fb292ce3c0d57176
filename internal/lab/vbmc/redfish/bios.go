package redfishbmc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The BIOS attributes as DMTF's Bios schema serves them: the Bios resource holds the current
// values and is read-only; its @Redfish.Settings names the settings object, which a client
// PATCHes with {"Attributes": {...}} and which shows what applies at the next reset.

const (
	biosURI         = systemURI + "/Bios"
	biosSettingsURI = biosURI + "/Settings"
)

// biosKind names the JSON type of an attribute value, for type checks and messages.
func biosKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return fmt.Sprintf("%T", v)
}

// normalizeBIOS turns a configured attribute value into what a JSON decoder with UseNumber
// gives (string, bool, json.Number, nil). Integers only: BIOS attribute registries know no
// other number type.
func normalizeBIOS(name string, v any) (any, error) {
	switch x := v.(type) {
	case nil, string, bool:
		return x, nil
	case int:
		return json.Number(strconv.FormatInt(int64(x), 10)), nil
	case int8, int16, int32, int64:
		return json.Number(fmt.Sprint(x)), nil
	case uint, uint8, uint16, uint32, uint64:
		return json.Number(fmt.Sprint(x)), nil
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return nil, fmt.Errorf("BIOS attribute %s: %v is not an integer", name, x)
		}
		return json.Number(strconv.FormatInt(int64(x), 10)), nil
	case json.Number:
		if _, err := strconv.ParseInt(string(x), 10, 64); err != nil {
			return nil, fmt.Errorf("BIOS attribute %s: %s is not an integer", name, x)
		}
		return x, nil
	}
	return nil, fmt.Errorf("BIOS attribute %s: type %T is not supported (accepted: string, bool, integer, nil)", name, v)
}

// initialBIOS is the current attributes of a new service: cfg's (copied, normalized), else the
// defaults.
func initialBIOS(cfg map[string]any) (map[string]any, error) {
	if cfg == nil {
		cfg = DefaultBIOSAttributes()
	}
	out := make(map[string]any, len(cfg))
	for name, v := range cfg {
		if name == "" {
			return nil, fmt.Errorf("a BIOS attribute has an empty name")
		}
		n, err := normalizeBIOS(name, v)
		if err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, nil
}

// CheckBIOSPatch validates the Attributes of a settings PATCH against the current attributes:
// each must exist, must not be write-only (null), and must have the current value's JSON type.
// It returns the problems, sorted by attribute (none: the patch is accepted). Pure.
func CheckBIOSPatch(current, patch map[string]any) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(patch)) {
		cur, ok := current[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: no such attribute", name))
		case cur == nil:
			problems = append(problems, fmt.Sprintf("%s: write-only attributes are not supported by this BMC", name))
		case biosKind(patch[name]) != biosKind(cur):
			problems = append(problems, fmt.Sprintf("%s: a %s was given, the attribute is a %s", name, biosKind(patch[name]), biosKind(cur)))
		}
	}
	return problems
}

// biosResource is the Bios resource: the current attributes.
func (s *Service) biosResource() map[string]any {
	s.mu.Lock()
	attrs := maps.Clone(s.bios)
	s.mu.Unlock()
	return map[string]any{"@odata.id": biosURI, "@odata.type": "#Bios.v1_2_0.Bios", "Id": "Bios",
		"Name": "BIOS Configuration Current Settings", "AttributeRegistry": "BiosAttributeRegistry.1.0.0",
		"Attributes": attrs,
		"@Redfish.Settings": map[string]any{"@odata.type": "#Settings.v1_3_5.Settings",
			"SettingsObject": ref(biosSettingsURI), "SupportedApplyTimes": []string{"OnReset"}}}
}

// biosSettingsResource is the settings object: the attributes pending for the next reset.
func (s *Service) biosSettingsResource() map[string]any {
	s.mu.Lock()
	attrs := maps.Clone(s.biosPending)
	s.mu.Unlock()
	if attrs == nil {
		attrs = map[string]any{}
	}
	return map[string]any{"@odata.id": biosSettingsURI, "@odata.type": "#Bios.v1_2_0.Bios", "Id": "Settings",
		"Name": "BIOS Configuration Pending Settings", "AttributeRegistry": "BiosAttributeRegistry.1.0.0",
		"Attributes": attrs}
}

// patchBIOSSettings merges a PATCH's Attributes into the pending settings, after checking them
// all (one bad attribute: 400, nothing merged).
func (s *Service) patchBIOSSettings(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.UseNumber()
	var body map[string]any
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	ifMatch := r.Header.Get("If-Match")
	if ifMatch == "" && s.cfg.Layout == LayoutSettings {
		writeError(w, http.StatusPreconditionRequired, "Base.1.15.PreconditionRequired",
			"A precondition header (If-Match) is required for this resource.")
		return
	}
	if ifMatch != "" && !ETagMatches(ifMatch, etagOf(s.biosSettingsResource())) {
		writeError(w, http.StatusPreconditionFailed, "Base.1.15.PreconditionFailed",
			"The ETag supplied did not match the ETag required to change this resource.")
		return
	}
	var attrs map[string]any
	for _, k := range slices.Sorted(maps.Keys(body)) {
		switch v := body[k]; {
		case k == "Attributes":
			m, ok := v.(map[string]any)
			if !ok {
				writeError(w, http.StatusBadRequest, "Base.1.15.PropertyValueTypeError", "The value of Attributes is not an object.")
				return
			}
			attrs = m
		case k == "@Redfish.SettingsApplyTime":
			at, _ := v.(map[string]any)
			if t, _ := at["ApplyTime"].(string); t != "OnReset" {
				writeError(w, http.StatusBadRequest, "Base.1.15.PropertyValueNotInList",
					"The value of @Redfish.SettingsApplyTime.ApplyTime is not supported: the only apply time is OnReset.")
				return
			}
		case strings.HasPrefix(k, "@odata."):
		default:
			writeError(w, http.StatusBadRequest, "Base.1.15.PropertyNotWritable",
				"The property "+k+" cannot be changed here: only Attributes can.")
			return
		}
	}
	if attrs == nil {
		writeError(w, http.StatusBadRequest, "Base.1.15.PropertyMissing", "The property Attributes is required.")
		return
	}
	s.mu.Lock()
	problems := CheckBIOSPatch(s.bios, attrs)
	if len(problems) == 0 {
		if s.biosPending == nil {
			s.biosPending = map[string]any{}
		}
		maps.Copy(s.biosPending, attrs)
	}
	s.mu.Unlock()
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "Base.1.15.PropertyValueTypeError",
			"The BIOS settings were not accepted: "+strings.Join(problems, "; ")+".")
		return
	}
	s.log.InfoContext(ctx, "redfish BIOS settings pending", "attributes", slices.Sorted(maps.Keys(attrs)))
	writeJSON(w, http.StatusOK, map[string]any{"@Message.ExtendedInfo": []any{map[string]any{
		"@odata.type": "#Message.v1_1_1.Message", "MessageId": "Base.1.15.Success",
		"Message": "The request completed successfully; the settings apply at the next reset.", "Severity": "OK"}}})
}

// applyBIOSSettings moves the pending BIOS settings into the current attributes, as the host's
// firmware does when it starts (with IgnoreBIOSSettings they are dropped instead). Returns the
// attributes applied.
func (s *Service) applyBIOSSettings(ctx context.Context) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.biosPending) == 0 {
		return nil
	}
	pending := s.biosPending
	s.biosPending = nil
	if s.cfg.Quirks.IgnoreBIOSSettings {
		s.log.InfoContext(ctx, "redfish BIOS settings dropped at reset (quirk)", "attributes", slices.Sorted(maps.Keys(pending)))
		return nil
	}
	maps.Copy(s.bios, pending)
	return slices.Sorted(maps.Keys(pending))
}

// BIOSAttribute returns the current value of a BIOS attribute (for tests): string, bool,
// json.Number or nil, and whether it exists.
func (s *Service) BIOSAttribute(name string) (any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.bios[name]
	return v, ok
}

// PendingBIOS returns a copy of the pending BIOS settings (for tests).
func (s *Service) PendingBIOS() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.biosPending)
}
