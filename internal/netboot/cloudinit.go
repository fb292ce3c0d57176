package netboot

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"text/template"
	"time"

	"bcd/internal/osagent/osjoin"
)

// Paths of the guest endpoints: what an image that runs no bcd (a cloud image with cloud-init,
// Flatcar or Fedora CoreOS with Ignition) reads at its first boot, and the call by which it
// proves it booted (docs/drivers/cloud-init.md). Like /metadata, each answers only the address
// the node's MAC booted from, and 404 until the control plane has prepared the node's instance.
const (
	// CloudInitPath is the NoCloud seed (seedfrom) directory: meta-data, user-data,
	// vendor-data.
	CloudInitPath = "/cloud-init/"
	// IgnitionPath is an Ignition config (spec 3.0.0).
	IgnitionPath = "/ignition.json"
	// RejoinPath: POST with "Authorization: Bearer <instance token>" (the token /metadata
	// serves): the site agent joins the gateway as the node's installed OS on its behalf.
	RejoinPath = "/rejoin"
)

// IgnitionSpec is the Ignition config version served (3.0.0: every Ignition 2.x release
// (spec 3) reads it: Flatcar 3185+, Fedora CoreOS).
const IgnitionSpec = "3.0.0"

// Where the snippets put the rejoin script on the installed OS.
const (
	// CloudInitScriptPath: cloud-init's scripts_per_boot runs it at every boot (the first
	// included, after write_files wrote it), so a later prepared instance (unrescue) is proven
	// too, though cloud-init's per-instance modules do not run again for the same instance-id.
	CloudInitScriptPath = "/var/lib/cloud/scripts/per-boot/bcd-rejoin.sh"
	// IgnitionScriptPath: /opt is writable on Flatcar (and /var/opt on Fedora CoreOS).
	IgnitionScriptPath = "/opt/bcd/rejoin.sh"
	IgnitionUnit       = "bcd-rejoin.service"
)

// Rejoiner joins the gateway as a node's installed OS on the OS's behalf. Errors wrapping
// osjoin.ErrSpent are answered 401; any other 503.
type Rejoiner interface {
	Join(ctx context.Context, md osjoin.Metadata) error
}

// guestTemplates are the snippets, rendered with the site's base URL (validated: URL-safe
// characters only, so no quote, space or shell metacharacter).
type guestTemplates struct {
	script, vendor, unit *template.Template
}

// rejoinScript is POSIX sh using curl (stock in the Debian, Ubuntu, Flatcar and Fedora
// CoreOS images), else wget. It reads the instance token from /metadata at each try (a boot
// after the instance was prepared again gets the new one), gives it to curl on standard input
// (never on a command line; wget's fallback cannot), and stops at 204 (done) or 401 (the token
// is spent: retrying cannot help); 404 (not published), 503 (gateway unreachable) and network
// errors are retried every 5 s for 5 minutes.
const rejoinScript = `#!/bin/sh
# bcd: prove to the control plane that this boot came up (POST /rejoin; docs/drivers/cloud-init.md).
base='{{.Base}}'
get() { curl -fsS --max-time 10 "$1" 2>/dev/null || wget -q -T 10 -O - "$1" 2>/dev/null; }
post() {
  if command -v curl >/dev/null 2>&1; then
    printf 'Authorization: Bearer %s\n' "$1" | curl -sS -o /dev/null -w '%{http_code}' --max-time 30 -X POST -H @- "$base{{.Rejoin}}"
  elif wget -q -T 30 -O /dev/null --post-data= --header="Authorization: Bearer $1" "$base{{.Rejoin}}" 2>/dev/null; then
    echo 204
  else
    echo 503
  fi
}
n=0
while [ "$n" -lt 60 ]; do
  n=$((n+1))
  token=$(get "$base{{.Metadata}}" | sed -n 's/.*"instanceToken":"\([^"]*\)".*/\1/p')
  if [ -n "$token" ]; then
    case "$(post "$token")" in
    204) echo "bcd rejoin: the control plane saw this boot"; exit 0 ;;
    401) echo "bcd rejoin: the instance token was refused: the control plane must prepare the instance again" >&2; exit 1 ;;
    esac
  fi
  sleep 5
done
echo "bcd rejoin: gave up after 60 tries" >&2
exit 1
`

// vendorData is the NoCloud vendor-data: the rejoin script, run at every boot.
const vendorData = `#cloud-config
# bcd: prove each boot to the control plane (docs/drivers/cloud-init.md).
write_files:
  - path: {{.Path}}
    owner: root:root
    permissions: '0755'
    content: |
{{.Indented}}`

// rejoinUnit is the Ignition systemd unit: oneshot, after the network is online, every boot.
const rejoinUnit = `[Unit]
Description=bcd: prove this boot to the control plane
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart={{.Path}}

[Install]
WantedBy=multi-user.target
`

func parseGuestTemplates() guestTemplates {
	return guestTemplates{
		script: template.Must(template.New("rejoin.sh").Parse(rejoinScript)),
		vendor: template.Must(template.New("vendor-data").Parse(vendorData)),
		unit:   template.Must(template.New(IgnitionUnit).Parse(rejoinUnit)),
	}
}

func render(t *template.Template, data any) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("rendering %s: %w", t.Name(), err)
	}
	return b.String(), nil
}

// RejoinScript renders the rejoin script for a site whose boot HTTP is base. Pure.
func RejoinScript(base string) (string, error) {
	if err := (ScriptParams{BaseURL: base, RetryAfter: time.Second}).check(); err != nil {
		return "", err
	}
	return render(parseGuestTemplates().script, struct{ Base, Rejoin, Metadata string }{base, RejoinPath, MetadataPath})
}

// VendorData renders the NoCloud vendor-data (#cloud-config) for base. Pure.
func VendorData(base string) (string, error) {
	script, err := RejoinScript(base)
	if err != nil {
		return "", err
	}
	var ind strings.Builder
	for l := range strings.Lines(script) {
		ind.WriteString("      " + l)
	}
	return render(parseGuestTemplates().vendor, struct{ Path, Indented string }{CloudInitScriptPath, ind.String()})
}

// UserData is the NoCloud user-data of a node whose deploy gave none: an empty cloud-config.
const UserData = "#cloud-config\n{}\n"

// MetaData renders the NoCloud meta-data of a node: its id as the instance-id. JSON strings are
// YAML double-quoted scalars, so any id is quoted safely. Pure.
func MetaData(nodeID string) string {
	id, _ := json.Marshal(nodeID)
	return "instance-id: " + string(id) + "\n"
}

// ignitionConfig is the subset of the Ignition 3.x config the site serves.
type ignitionConfig struct {
	Ignition struct {
		Version string                `json:"version"`
		Config  *ignitionConfigMerges `json:"config,omitempty"`
	} `json:"ignition"`
	Storage struct {
		Files []ignitionFile `json:"files"`
	} `json:"storage"`
	Systemd struct {
		Units []ignitionUnit `json:"units"`
	} `json:"systemd"`
}

type ignitionFile struct {
	Path      string `json:"path"`
	Mode      int    `json:"mode"`
	Overwrite bool   `json:"overwrite"`
	Contents  struct {
		Source string `json:"source"`
	} `json:"contents"`
}

type ignitionUnit struct {
	Name     string `json:"name"`
	Enabled  bool   `json:"enabled"`
	Contents string `json:"contents"`
}

// IgnitionConfig renders the Ignition config for base: the rejoin script (a base64 data URL)
// and an enabled oneshot unit that runs it. Pure.
func IgnitionConfig(base string) ([]byte, error) {
	return IgnitionConfigMerging(base, nil)
}

// IgnitionConfigMerging renders IgnitionConfig for base; with user (the operator's Ignition
// config) it also merges base+IgnitionUserPath, verified by user's SHA-512 (Ignition fetches
// it and refuses other bytes). Pure.
func IgnitionConfigMerging(base string, user []byte) ([]byte, error) {
	script, err := RejoinScript(base)
	if err != nil {
		return nil, err
	}
	unit, err := render(parseGuestTemplates().unit, struct{ Path string }{IgnitionScriptPath})
	if err != nil {
		return nil, err
	}
	var c ignitionConfig
	c.Ignition.Version = IgnitionSpec
	f := ignitionFile{Path: IgnitionScriptPath, Mode: 0o755, Overwrite: true}
	f.Contents.Source = "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(script))
	c.Storage.Files = []ignitionFile{f}
	c.Systemd.Units = []ignitionUnit{{Name: IgnitionUnit, Enabled: true, Contents: unit}}
	if user != nil {
		c.Ignition.Config = &ignitionConfigMerges{Merge: []ignitionResource{userResource(base, user)}}
	}
	return json.MarshalIndent(c, "", "  ")
}

// guestDocs are the rendered snippets (fixed per site: the base URL).
type guestDocs struct {
	vendor   string
	ignition []byte
}

func renderGuestDocs(base string) (guestDocs, error) {
	v, err := VendorData(base)
	if err != nil {
		return guestDocs{}, err
	}
	ign, err := IgnitionConfig(base)
	if err != nil {
		return guestDocs{}, err
	}
	return guestDocs{vendor: v, ignition: ign}, nil
}

// publishedNode is the node whose instance the metadata for r's address names; false (the
// caller answers 404) when there is none, as /metadata does.
func (h *Handler) publishedNode(r *http.Request) ([]byte, string, bool) {
	addr := remoteAddr(r)
	if h.metadata == nil || !addr.IsValid() {
		return nil, "", false
	}
	doc, ok := h.metadata.Metadata(r.Context(), addr)
	if !ok {
		return nil, "", false
	}
	var m struct {
		NodeID        string `json:"nodeId"`
		InstanceToken string `json:"instanceToken"`
	}
	if err := json.Unmarshal(doc, &m); err != nil || m.NodeID == "" || m.InstanceToken == "" {
		h.logQuiet(r.Context(), slog.LevelError, "guest-metadata "+addr.String(), "metadata document without node or instance token", "remote", addr.String())
		return nil, "", false
	}
	return doc, m.NodeID, true
}

// registerGuest adds the guest endpoints to mux.
func (h *Handler) registerGuest(mux *http.ServeMux, rejoin Rejoiner) error {
	docs, err := renderGuestDocs(h.params.BaseURL)
	if err != nil {
		return fmt.Errorf("guest snippets: %w", err)
	}
	if rejoin == nil {
		rejoin = osjoin.NewJoiner(osjoin.JoinerConfig{Logger: h.log})
	}
	text := func(body func(nodeID string) string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, node, ok := h.publishedNode(r)
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = w.Write([]byte(body(node)))
		}
	}
	mux.HandleFunc("GET "+CloudInitPath+"meta-data", text(MetaData))
	mux.HandleFunc("GET "+CloudInitPath+"user-data", func(w http.ResponseWriter, r *http.Request) {
		user, ok := h.nodeUserData(w, r)
		if !ok {
			return
		}
		if user == nil {
			user = []byte(UserData)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(user)
	})
	mux.HandleFunc("GET "+CloudInitPath+"vendor-data", text(func(string) string { return docs.vendor }))
	mux.HandleFunc("GET "+IgnitionPath, func(w http.ResponseWriter, r *http.Request) {
		user, ok := h.nodeUserData(w, r)
		if !ok {
			return
		}
		doc := docs.ignition
		if ignitionUser(user) {
			var err error
			if doc, err = IgnitionConfigMerging(h.params.BaseURL, user); err != nil {
				h.logQuiet(r.Context(), slog.LevelError, "ignition-merge", "rendering the Ignition config", "err", err)
				http.Error(w, "the Ignition config cannot be rendered: see the site agent's log", http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(doc)
	})
	mux.HandleFunc("GET "+IgnitionUserPath, func(w http.ResponseWriter, r *http.Request) {
		user, ok := h.nodeUserData(w, r)
		if !ok {
			return
		}
		if !ignitionUser(user) {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(user)
	})
	mux.HandleFunc("POST "+RejoinPath, func(w http.ResponseWriter, r *http.Request) { h.serveRejoin(w, r, rejoin) })
	return nil
}

// rejoinAnswer decides the answer to a POST /rejoin from the join's error. Pure.
func rejoinAnswer(err error) (status int, msg string) {
	switch {
	case err == nil:
		return http.StatusNoContent, ""
	case errors.Is(err, osjoin.ErrSpent):
		return http.StatusUnauthorized, "the gateway refused this node's instance token (used or expired): the control plane must prepare the instance again"
	default:
		return http.StatusServiceUnavailable, "the gateway cannot be reached now: try again"
	}
}

func (h *Handler) serveRejoin(w http.ResponseWriter, r *http.Request, rejoin Rejoiner) {
	ctx := r.Context()
	remote := remoteAddr(r)
	doc, node, ok := h.publishedNode(r)
	if !ok {
		http.NotFound(w, r)
		return
	}
	md, err := osjoin.ParseMetadata(doc)
	if err != nil {
		h.logQuiet(ctx, slog.LevelError, "rejoin-metadata "+node, "rejoin: the node's metadata is unusable", "node", node, "err", err)
		http.Error(w, "this node's metadata is unusable: see the site agent's log", http.StatusServiceUnavailable)
		return
	}
	given, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !bearer || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(given)), []byte(md.InstanceToken)) != 1 {
		h.logQuiet(ctx, slog.LevelWarn, "rejoin-token "+remote.String(), "rejoin refused: the bearer token is not the node's instance token",
			"node", node, "remote", remote.String())
		w.Header().Set("WWW-Authenticate", "Bearer")
		http.Error(w, "Authorization: Bearer must carry the instance token this address's /metadata holds now", http.StatusUnauthorized)
		return
	}
	err = rejoin.Join(ctx, md)
	status, msg := rejoinAnswer(err)
	switch status {
	case http.StatusNoContent:
		w.WriteHeader(status)
		return
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(h.params.RetryAfter.Seconds()))))
	}
	h.logQuiet(ctx, slog.LevelWarn, "rejoin "+node, "rejoin on behalf of the node's installed OS failed", "node", node, "status", status, "err", err)
	http.Error(w, msg, status)
}
