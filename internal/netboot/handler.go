package netboot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"bcd/internal/lograte"
)

// EntryLookup answers the boot entry of a MAC (the boot-lease holder's copy).
type EntryLookup interface {
	Entry(ctx context.Context, mac net.HardwareAddr) (Entry, bool)
}

// Discovery is one request for a script by a machine that has no boot entry, or (Inventory
// set) the self-asserted inventory a discovery-mode ramdisk reported for the MAC it booted with.
type Discovery struct {
	MAC        net.HardwareAddr
	UUID       string
	Arch       string
	RemoteAddr netip.Addr
	Time       time.Time
	Inventory  []byte // compact JSON object; nil for a script request
}

// DiscoveryRecorder records machines that network-boot without an entry.
type DiscoveryRecorder interface {
	RecordDiscovery(ctx context.Context, d Discovery) error
}

// BindingLookup answers whether addr is the address the site's DHCP saw mac take (the
// address its boot script and metadata may go to).
type BindingLookup interface {
	BootsFrom(mac net.HardwareAddr, addr netip.Addr) bool
}

// WithheldRecorder is told of every boot script the binding withheld.
type WithheldRecorder interface {
	RecordWithheld(mac net.HardwareAddr, remote netip.Addr, at time.Time)
}

// RejectionLookup answers whether an operator rejected the machine with a MAC (acceptance flow).
type RejectionLookup interface {
	Rejected(ctx context.Context, mac net.HardwareAddr) bool
}

// MetadataLookup answers the metadata document (JSON) of the node that owns addr.
type MetadataLookup interface {
	Metadata(ctx context.Context, addr netip.Addr) ([]byte, bool)
}

// ArtifactStore is what the handler needs of the cache.
type ArtifactStore interface {
	Has(sha string) bool
	ServeArtifact(w http.ResponseWriter, r *http.Request, sha string)
}

// HandlerConfig configures the site's HTTP boot handler.
type HandlerConfig struct {
	BaseURL    string        // http://site:port as machines reach it; no trailing slash
	RetryAfter time.Duration // sleep of waiting machines; 0: 10 s
	Entries    EntryLookup
	Discovery  DiscoveryRecorder
	Artifacts  ArtifactStore
	Metadata   MetadataLookup // nil: /metadata answers 404
	Rejoin     Rejoiner       // joins for POST /rejoin (cloudinit.go); nil: an osjoin.Joiner
	BinaryDir  string         // iPXE binaries served under /ipxe/ (e.g. /usr/lib/ipxe); "" disables
	// UserData answers a node's operator user-data (userdata.go); nil: none is ever set, and
	// the guest endpoints serve bcd's defaults.
	UserData UserDataLookup
	// DiscoveryBoot, when set (a KindDiscovery entry), is served to machines with no entry
	// instead of the waiting script (acceptance flow); nil: they wait.
	DiscoveryBoot *Entry
	// Rejections: machines an operator rejected are told so by the decision answer (410);
	// nil: no machine is told it was rejected.
	Rejections RejectionLookup
	// Bindings, when set, withholds a MAC's boot script (which carries its one-time token)
	// from every address but the one the site's DHCP saw that MAC take: the requester gets a
	// script that asks DHCP again and retries. nil: the script goes to whoever asks by MAC.
	Bindings BindingLookup
	// Withheld, when set, is told of each script Bindings withheld.
	Withheld WithheldRecorder
	Now      func() time.Time
	Logger   *slog.Logger
}

// Handler serves /boot.ipxe, /artifacts/<sha256>/<name>, /ipxe/<binary> and /metadata.
type Handler struct {
	params    ScriptParams
	entries   EntryLookup
	discovery DiscoveryRecorder
	artifacts ArtifactStore
	metadata  MetadataLookup
	userData  UserDataLookup
	binaries  *os.Root
	discBoot  *Entry
	rejects   RejectionLookup
	bindings  BindingLookup
	withheld  WithheldRecorder
	now       func() time.Time
	log       *slog.Logger
	mux       *http.ServeMux
	// quiet holds back repeated warnings of refused requests (loglimit.go).
	quiet *lograte.Limiter
}

// Refused requests are logged once per source and quietInterval; at most quietKeys sources are
// remembered.
const (
	quietInterval = time.Minute
	quietKeys     = 4096
)

// NewHandler checks the configuration and builds the handler.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	h := &Handler{
		quiet:     lograte.New(quietInterval, quietKeys),
		params:    ScriptParams{BaseURL: cfg.BaseURL, RetryAfter: cfg.RetryAfter},
		entries:   cfg.Entries,
		discovery: cfg.Discovery,
		artifacts: cfg.Artifacts,
		metadata:  cfg.Metadata,
		userData:  cfg.UserData,
		discBoot:  cfg.DiscoveryBoot,
		rejects:   cfg.Rejections,
		bindings:  cfg.Bindings,
		withheld:  cfg.Withheld,
		now:       cfg.Now,
		log:       cfg.Logger,
	}
	if h.params.RetryAfter == 0 {
		h.params.RetryAfter = 10 * time.Second
	}
	if err := h.params.check(); err != nil {
		return nil, fmt.Errorf("netboot handler: %w", err)
	}
	if h.entries == nil || h.discovery == nil || h.artifacts == nil {
		return nil, errors.New("netboot handler: entries, discovery and artifacts are required")
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.discBoot != nil {
		if h.discBoot.Kind != KindDiscovery {
			return nil, fmt.Errorf("netboot handler: the discovery boot entry is a %s entry, not %s", h.discBoot.Kind, KindDiscovery)
		}
		if err := h.discBoot.Validate(); err != nil {
			return nil, fmt.Errorf("netboot handler: discovery boot entry: %w", err)
		}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if cfg.BinaryDir != "" {
		root, err := os.OpenRoot(cfg.BinaryDir)
		if err != nil {
			return nil, fmt.Errorf("netboot handler: opening binary dir: %w", err)
		}
		h.binaries = root
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ScriptPath, h.serveScript)
	mux.HandleFunc("GET "+ArtifactPath+"{sha}/{name}", h.serveArtifact)
	mux.HandleFunc("GET "+BinaryPath+"{name}", h.serveBinary)
	mux.HandleFunc("GET "+MetadataPath, h.serveMetadata)
	mux.HandleFunc("POST "+DiscoveryPath, h.serveDiscoveryReport)
	mux.HandleFunc("GET "+DecisionPath, h.serveDecision)
	if err := h.registerGuest(mux, cfg.Rejoin); err != nil {
		return nil, fmt.Errorf("netboot handler: %w", err)
	}
	h.mux = mux
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func writeScript(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(s))
}

func (h *Handler) serveScript(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	req, err := ParseQuery(r.URL.RawQuery)
	if err != nil {
		// Any host on the provisioning network can ask: one line per host and minute.
		h.logQuiet(ctx, slog.LevelWarn, "refused-script "+remoteAddr(r).String(), "boot script request refused",
			"remote", r.RemoteAddr, "err", err)
		http.Error(w, "bad boot request: "+err.Error(), http.StatusBadRequest)
		return
	}
	entry, ok := h.entries.Entry(ctx, req.MAC)
	if !ok {
		d := Discovery{MAC: req.MAC, UUID: req.UUID, Arch: req.Arch, RemoteAddr: remoteAddr(r), Time: h.now()}
		if err := h.discovery.RecordDiscovery(ctx, d); err != nil {
			h.logQuiet(ctx, slog.LevelError, "record-script", "recording discovery", "mac", req.MAC.String(), "err", err)
		}
		if h.discBoot != nil {
			h.serveEntry(w, r, req, *h.discBoot)
			return
		}
		s, _ := WaitScript(req, h.params, WaitNoEntry) // inputs validated above
		writeScript(w, s)
		return
	}
	if remote, ok := h.withhold(req.MAC, r); ok {
		h.logQuiet(ctx, slog.LevelWarn, "withheld "+req.MAC.String()+" "+remote.String(),
			"boot script withheld: the request did not come from the address the site's DHCP saw this MAC take",
			"mac", req.MAC.String(), "remote", remote.String())
		s, _ := WaitScript(req, h.params, WaitAddress)
		writeScript(w, s)
		return
	}
	h.serveEntry(w, r, req, entry)
}

// logQuiet logs msg unless a line for key went out less than quietInterval ago; the line says
// how many were held back since the last one (held_back). For what a request from anyone on
// the provisioning network makes the handler say, so that a host asking in a loop cannot flood
// the agent's log.
func (h *Handler) logQuiet(ctx context.Context, level slog.Level, key, msg string, attrs ...any) {
	h.quiet.Log(ctx, h.log, level, h.now(), key, msg, attrs...)
}

// withhold says whether what carries mac's one-time token (its boot script, its discovery
// decision) is withheld from r: the boot binding is on and r did not come from the address the
// site's DHCP saw mac take. A withheld request is recorded (Withheld); the caller logs it.
func (h *Handler) withhold(mac net.HardwareAddr, r *http.Request) (netip.Addr, bool) {
	remote := remoteAddr(r)
	if h.bindings == nil || h.bindings.BootsFrom(mac, remote) {
		return remote, false
	}
	if h.withheld != nil {
		h.withheld.RecordWithheld(mac, remote, h.now())
	}
	return remote, true
}

// serveEntry answers the script of entry, or a waiting one while it cannot boot yet.
func (h *Handler) serveEntry(w http.ResponseWriter, r *http.Request, req Request, entry Entry) {
	ctx := r.Context()
	if err := entry.Validate(); err != nil {
		h.logQuiet(ctx, slog.LevelError, "invalid "+req.MAC.String(), "boot entry invalid", "mac", req.MAC.String(), "err", err)
		s, _ := WaitScript(req, h.params, WaitEntryUnbootable)
		writeScript(w, s)
		return
	}
	for _, a := range entry.Artifacts() {
		if !h.artifacts.Has(a.SHA256) {
			h.logQuiet(ctx, slog.LevelInfo, "waits "+req.MAC.String(), "boot waits for artifact",
				"mac", req.MAC.String(), "artifact", a.Name, "sha256", a.SHA256)
			s, _ := WaitScript(req, h.params, WaitArtifacts)
			writeScript(w, s)
			return
		}
	}
	s, err := Script(&entry, req, h.params)
	if err != nil {
		h.log.ErrorContext(ctx, "rendering boot script", "mac", req.MAC.String(), "err", err)
		s, _ = WaitScript(req, h.params, WaitEntryUnbootable)
	} else {
		h.log.InfoContext(ctx, "boot script served", "mac", req.MAC.String(), "kind", string(entry.Kind))
	}
	writeScript(w, s)
}

func (h *Handler) serveArtifact(w http.ResponseWriter, r *http.Request) {
	sha, name := r.PathValue("sha"), r.PathValue("name")
	if !IsSHA256(sha) || validateArtifactName(name) != nil {
		http.Error(w, "bad artifact path", http.StatusBadRequest)
		return
	}
	h.artifacts.ServeArtifact(w, r, sha)
}

func (h *Handler) serveBinary(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if h.binaries == nil || validateArtifactName(name) != nil {
		http.NotFound(w, r)
		return
	}
	f, err := h.binaries.Open(name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/efi")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

func (h *Handler) serveMetadata(w http.ResponseWriter, r *http.Request) {
	addr := remoteAddr(r)
	if h.metadata == nil || !addr.IsValid() {
		http.NotFound(w, r)
		return
	}
	doc, ok := h.metadata.Metadata(r.Context(), addr)
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(doc)
}
