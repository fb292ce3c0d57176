package netboot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
)

// MaxDiscoveryReport bounds a discovery-mode ramdisk's report.
const MaxDiscoveryReport = 64 << 10

// DiscoveryReport is what a discovery-mode ramdisk posts to DiscoveryPath: the MAC it booted
// with (bcd.bootmac) and its self-asserted inventory (systemUuid, macs, disks, …). Nothing in
// it is proof of anything: it is shown to an operator who decides.
type DiscoveryReport struct {
	BootMAC    string   `json:"bootMac"`
	SystemUUID string   `json:"systemUuid"`
	MACs       []string `json:"macs"`
}

// ParseDiscoveryReport validates a report: a JSON object of at most MaxDiscoveryReport bytes
// with a valid bootMac (and, when given, a valid systemUuid and MACs). It returns the boot
// MAC, the canonical UUID ("" when absent) and the compacted document. Pure.
func ParseDiscoveryReport(body []byte) (mac string, uuid string, doc []byte, err error) {
	if len(body) > MaxDiscoveryReport {
		return "", "", nil, fmt.Errorf("report of %d bytes: at most %d", len(body), MaxDiscoveryReport)
	}
	var rep DiscoveryReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return "", "", nil, errors.New("report is not a JSON object with bootMac, systemUuid, macs")
	}
	hw, err := ParseMAC(rep.BootMAC)
	if err != nil {
		return "", "", nil, fmt.Errorf("bootMac: %w", err)
	}
	if rep.SystemUUID != "" {
		if uuid, err = ParseUUID(rep.SystemUUID); err != nil {
			return "", "", nil, fmt.Errorf("systemUuid: %w", err)
		}
	}
	if len(rep.MACs) > 64 {
		return "", "", nil, fmt.Errorf("%d MACs: at most 64", len(rep.MACs))
	}
	for i, m := range rep.MACs {
		if _, err := ParseMAC(m); err != nil {
			return "", "", nil, fmt.Errorf("macs[%d]: %w", i, err)
		}
	}
	var b bytes.Buffer
	if err := json.Compact(&b, body); err != nil {
		return "", "", nil, errors.New("report is not valid JSON")
	}
	return hw.String(), uuid, b.Bytes(), nil
}

// serveDiscoveryReport records a discovery-mode ramdisk's report.
func (h *Handler) serveDiscoveryReport(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxDiscoveryReport+1))
	if err != nil {
		http.Error(w, "reading the report failed", http.StatusBadRequest)
		return
	}
	mac, _, doc, err := ParseDiscoveryReport(body)
	if err != nil {
		// Any host on the provisioning network can post: one line per host and minute.
		if ok, held := h.quiet.Allow("refused "+remoteAddr(r).String(), h.now()); ok {
			h.log.WarnContext(ctx, "discovery report refused", "remote", r.RemoteAddr, "err", err, "held_back", held)
		}
		http.Error(w, "bad discovery report: "+err.Error(), http.StatusBadRequest)
		return
	}
	hw, _ := ParseMAC(mac)
	if err := h.discovery.RecordDiscovery(ctx, Discovery{MAC: hw, RemoteAddr: remoteAddr(r), Time: h.now(), Inventory: doc}); err != nil {
		// A flood fills the reports waiting to be sent: one line per minute says so.
		if ok, held := h.quiet.Allow("record", h.now()); ok {
			h.log.ErrorContext(ctx, "recording discovery report", "mac", mac, "err", err, "held_back", held)
		}
		http.Error(w, "the report could not be recorded", http.StatusServiceUnavailable)
		return
	}
	h.logQuiet(ctx, slog.LevelInfo, "recorded "+remoteAddr(r).String(), "discovery report recorded (self-asserted)", "mac", mac, "remote", r.RemoteAddr)
	w.WriteHeader(http.StatusNoContent)
}

// DecisionPath is where a waiting discovery-mode ramdisk asks (?mac=BOOTMAC) whether its
// machine was accepted (acceptance flow, DESIGN §6). 204: no decision it can act on yet. 200
// (text/plain): the kernel command line of the ramdisk entry the control plane pushed for the
// MAC once it was accepted, with its one-time token: the ramdisk joins with it as the node,
// without a reboot. Like the boot script (GET /boot.ipxe?mac=…), it goes only to the address
// the agent's DHCP saw the MAC take when the boot binding is on: another host asking with the
// MAC gets 204 and the request is recorded as withheld. 410: an operator rejected the machine
// (the ramdisk powers its host off).
const DecisionPath = DiscoveryPath + "/decision"

// serveDecision answers a discovery-mode ramdisk's decision poll.
func (h *Handler) serveDecision(w http.ResponseWriter, r *http.Request) {
	hw, err := ParseMAC(r.URL.Query().Get("mac"))
	if err != nil {
		http.Error(w, "bad decision request: mac: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	entry, ok := h.entries.Entry(r.Context(), hw)
	if !ok && h.rejects != nil && h.rejects.Rejected(r.Context(), hw) {
		h.logQuiet(r.Context(), slog.LevelInfo, "rejected "+hw.String(), "discovery-mode ramdisk told its decision: rejected", "mac", hw.String(), "remote", r.RemoteAddr)
		http.Error(w, "rejected: an operator declined this machine", http.StatusGone)
		return
	}
	if !ok || entry.Kind != KindRamdisk || entry.Validate() != nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// The command line carries the node's one-time token, which the boot script withholds from
	// any other address: so does the decision.
	if remote, withheld := h.withhold(hw, r); withheld {
		if ok, held := h.quiet.Allow("decision "+hw.String()+" "+remote.String(), h.now()); ok {
			h.log.WarnContext(r.Context(), "decision withheld: the request did not come from the address the site's DHCP saw this MAC take",
				"mac", hw.String(), "remote", remote.String(), "held_back", held)
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	cmdline, err := entry.cmdline(h.params.BaseURL)
	if err != nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	h.log.InfoContext(r.Context(), "discovery-mode ramdisk told its decision: join", "mac", hw.String(), "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(cmdline))
}
