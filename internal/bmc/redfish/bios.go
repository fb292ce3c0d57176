package redfish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"bcd/internal/bmc"
)

var _ bmc.BIOSSetter = (*Client)(nil)

// biosDoc is a Bios resource: the current attributes, and the settings object that takes
// writes (DMTF's Bios schema: the Bios resource itself is read-only on most BMCs).
type biosDoc struct {
	Attributes map[string]json.RawMessage `json:"Attributes"`
	Settings   *struct {
		SettingsObject      odataRef `json:"SettingsObject"`
		SupportedApplyTimes []string `json:"SupportedApplyTimes"`
	} `json:"@Redfish.Settings"`
}

// applyOnReset is the @Redfish.SettingsApplyTime of a BIOS settings write.
const applyOnReset = "OnReset"

// bios reads the system's Bios resource and returns it with its URI. A system without a Bios
// link, or a Bios resource without attributes, is an error.
func (c *Client) bios(ctx context.Context) (biosDoc, string, error) {
	var doc biosDoc
	sysURI, err := c.systemURI(ctx)
	if err != nil {
		return doc, "", err
	}
	var sys struct {
		Bios odataRef `json:"Bios"`
	}
	if _, err := c.getJSON(ctx, sysURI, &sys); err != nil {
		return doc, "", err
	}
	uri := requestURI(sys.Bios.ID)
	if uri == "" {
		return doc, "", fmt.Errorf("the BMC exposes no BIOS resource under the system %s (it has no Bios link): "+
			"its BIOS settings cannot be read or written through Redfish", sysURI)
	}
	if _, err := c.getJSON(ctx, uri, &doc); err != nil {
		return doc, "", err
	}
	if len(doc.Attributes) == 0 {
		return doc, "", fmt.Errorf("the BMC's BIOS resource %s reports no Attributes", uri)
	}
	return doc, uri, nil
}

// checkNames refuses an empty attribute name and more than bmc.MaxBIOSSettings names.
func checkNames(names []string) error {
	if len(names) > bmc.MaxBIOSSettings {
		return fmt.Errorf("%d BIOS attributes named: at most %d are accepted", len(names), bmc.MaxBIOSSettings)
	}
	if slices.Contains(names, "") {
		return errors.New("a BIOS attribute name is empty")
	}
	return nil
}

// BIOSAttributes reads the current value of each named BIOS attribute from the system's Bios
// resource, as text (BIOSText); no names: every attribute. An attribute the BMC does not report,
// or reports as null (a write-only attribute such as a password), is absent from the map.
func (c *Client) BIOSAttributes(ctx context.Context, names []string) (map[string]string, error) {
	const what = "reading BIOS attributes"
	if err := checkNames(names); err != nil {
		return nil, fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err)
	}
	out := map[string]string{}
	err := c.retry(ctx, what, func(ctx context.Context) error {
		clear(out)
		doc, _, err := c.bios(ctx)
		if err != nil {
			return err
		}
		read := names
		if len(read) == 0 {
			read = slices.Collect(maps.Keys(doc.Attributes))
		}
		for _, name := range read {
			if text, ok := BIOSText(doc.Attributes[name]); ok {
				out[name] = text
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetBIOSAttributes writes, as pending settings applied at the next reset, the attributes of
// want whose current value differs (PlanBIOS), to the settings object the Bios resource names
// in @Redfish.Settings (Bios/Settings on iLO and iDRAC, Bios/Pending on XCC, Bios/SD on AMI
// MegaRAC), with If-Match when that object gives an ETag and @Redfish.SettingsApplyTime OnReset
// when the BMC lists it among SupportedApplyTimes. Nothing differs: nothing is written.
func (c *Client) SetBIOSAttributes(ctx context.Context, want map[string]string) ([]string, error) {
	const what = "writing BIOS settings"
	if err := checkNames(slices.Collect(maps.Keys(want))); err != nil {
		return nil, fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err)
	}
	if len(want) == 0 {
		return []string{}, nil
	}
	var changed []string
	var target string
	err := c.retry(ctx, what, func(ctx context.Context) error {
		changed = nil
		doc, uri, err := c.bios(ctx)
		if err != nil {
			return err
		}
		patch, names, err := PlanBIOS(doc.Attributes, want)
		if err != nil {
			return err
		}
		if len(names) == 0 {
			return nil
		}
		if doc.Settings == nil || requestURI(doc.Settings.SettingsObject.ID) == "" {
			return fmt.Errorf("the BMC offers no BIOS settings object (@Redfish.Settings) in %s: "+
				"its BIOS attributes are read-only through Redfish", uri)
		}
		target = requestURI(doc.Settings.SettingsObject.ID)
		body := map[string]any{"Attributes": patch}
		if slices.Contains(doc.Settings.SupportedApplyTimes, applyOnReset) {
			body["@Redfish.SettingsApplyTime"] = map[string]string{"ApplyTime": applyOnReset}
		}
		tag, err := c.settingsETag(ctx, target)
		if err != nil {
			return err
		}
		if err := c.send(ctx, http.MethodPatch, target, body, tag); err != nil {
			return err
		}
		changed = names
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(changed) == 0 {
		return []string{}, nil
	}
	c.log.InfoContext(ctx, "redfish BIOS settings written, pending the next reset", "attributes", changed, "settings", target)
	return changed, nil
}

// settingsETag reads the ETag of a settings object, for If-Match ("" when it has none). Some
// BMCs take only PATCH there (AMI MegaRAC's Bios/SD answers GET with 404): the write then goes
// without If-Match.
func (c *Client) settingsETag(ctx context.Context, uri string) (string, error) {
	var doc struct{}
	tag, err := c.getJSON(ctx, uri, &doc)
	switch {
	case err == nil:
		return tag, nil
	case isStatus(err, http.StatusNotFound) || isStatus(err, http.StatusMethodNotAllowed):
		c.log.DebugContext(ctx, "redfish BIOS settings object cannot be read; writing it without If-Match", "settings", uri,
			"reason", c.redactor().message(err))
		return "", nil
	}
	return "", err
}

// BIOSText is the text of a BIOS attribute value as the BMC reports it: a JSON string as it is,
// a number in decimal (an integral one without a fraction or exponent), a boolean as true or
// false, an object or array as compact JSON. Null (a write-only attribute) and an absent or
// malformed value are not reported: ok is false. Pure.
func BIOSText(raw json.RawMessage) (text string, ok bool) {
	raw = bytes.TrimSpace(raw)
	switch jsonKind(raw) {
	case "", "null":
		return "", false
	case "string":
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case "boolean":
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return "", false
		}
		return strconv.FormatBool(b), true
	case "object", "array":
		var buf bytes.Buffer
		if json.Compact(&buf, raw) != nil {
			return "", false
		}
		return buf.String(), true
	}
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return "", false
	}
	if i, err := n.Int64(); err == nil {
		return strconv.FormatInt(i, 10), true
	}
	f, err := n.Float64()
	if err != nil {
		return string(n), true // out of float64's range: as the BMC wrote it
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<63 {
		return strconv.FormatInt(int64(f), 10), true
	}
	return strconv.FormatFloat(f, 'f', -1, 64), true
}

// PlanBIOS decides the settings write that gives the attributes of want (name → value as text)
// to a BMC whose current attributes are current: each value is given the JSON type of the
// current one (a string as it is; a number as an integer, written in canonical decimal; a
// boolean as true or false), and only those that differ from the current value go into patch.
// changed lists them, sorted. An attribute the BMC does not report, a null current value (a
// write-only attribute), or a value that cannot take the current type is an error naming every
// such attribute, and nothing is to be written. Pure.
func PlanBIOS(current map[string]json.RawMessage, want map[string]string) (patch map[string]any, changed []string, err error) {
	var missing, bad []string
	patch = map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		raw, ok := current[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		v, differs, err := biosValue(raw, want[name])
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		if differs {
			patch[name] = v
			changed = append(changed, name)
		}
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("the BMC does not report BIOS attribute(s) %s (names are case-sensitive; it reports %d attributes)",
			strings.Join(missing, ", "), len(current)))
	}
	problems = append(problems, bad...)
	if len(problems) > 0 {
		return nil, nil, fmt.Errorf("nothing written: %s", strings.Join(problems, "; "))
	}
	return patch, changed, nil
}

// jsonKind names the JSON type of a value by its first byte ("" when it is none).
func jsonKind(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	switch c := raw[0]; {
	case c == 'n':
		return "null"
	case c == '"':
		return "string"
	case c == 't' || c == 'f':
		return "boolean"
	case c == '-' || (c >= '0' && c <= '9'):
		return "number"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	}
	return ""
}

// biosValue gives want the JSON type of the current value cur, and says whether it differs.
func biosValue(cur json.RawMessage, want string) (any, bool, error) {
	cur = bytes.TrimSpace(cur)
	have, _ := BIOSText(cur)
	switch kind := jsonKind(cur); kind {
	case "null":
		return nil, false, errors.New("the BMC reports it as null (a write-only attribute, such as a password): writing it is not supported")
	case "string":
		return want, have != want, nil
	case "boolean":
		switch want {
		case "true":
			return true, have != want, nil
		case "false":
			return false, have != want, nil
		}
		return nil, false, fmt.Errorf("%q is not a boolean: the attribute is a boolean, write true or false", want)
	case "number":
		i, err := strconv.ParseInt(want, 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("%q is not an integer: the attribute is a number, write a decimal integer", want)
		}
		if canon := strconv.FormatInt(i, 10); canon != want {
			return nil, false, fmt.Errorf("%q is not in canonical form: write %s (the read-back after the reset compares text)", want, canon)
		}
		return i, have != want, nil
	case "":
		return nil, false, errors.New("the BMC reports no readable value")
	default:
		return nil, false, fmt.Errorf("the BMC reports it as a JSON %s: only string, number and boolean attributes are supported", kind)
	}
}
