package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/inventory"
)

// MarkerDiscovery is printed in discovery mode with the self-asserted inventory summary.
const MarkerDiscovery = "bcd-ramdisk: discovery"

// Run is the whole agent: Start, then in join mode join the control plane through agentlink
// (retrying, with doubling delays capped at 30 s, until the gateway answers) and run the
// commands it sends until ctx ends. It returns an error when the command line is bad or the
// gateway refuses the token or the certificate (retrying cannot help; the console says why).
//
// Discovery mode (bcd.mode=discovery, no token) has no identity to join with: the agent prints
// its self-asserted inventory (product UUID, MACs, disks) on the console and in the log, posts
// it to the site (bcd.report, with the boot MAC; retrying) and waits, asking the site every
// DecisionPoll for its decision: once an operator accepted the machine, the site has a ramdisk
// entry for its boot MAC, and the agent joins with that entry's command line (its one-time
// token) as the node, without a reboot; once an operator rejected it, the agent says so on the
// console and powers its host off.
func Run(ctx context.Context, console io.Writer, log *slog.Logger, cfg Config) error {
	cfg.defaults()
	s, err := Start(ctx, console, log, cfg)
	if err != nil {
		return err
	}
	cmds := cfg.Commands
	if cmds == nil {
		cmds = NewCommands(LinuxDeps(log))
	}
	hints := agentlink.NodeHints{ProductUUID: s.Hints.SystemUUID, MACs: s.Hints.MACs}
	inv, ierr := cmds.d.Inventory(ctx)
	if ierr != nil {
		log.WarnContext(ctx, "no inventory at start-up; joining with the start-up hints", "err", ierr)
	} else {
		r := NewInventoryResult(inv)
		hints = agentlink.NodeHints{ProductUUID: r.SystemUUID, MACs: r.MACs}
	}

	if s.Params.Mode == ModeDiscovery {
		p, accepted, err := discover(ctx, console, log, s.Params, cfg, hints, inv, ierr, cmds.d.PowerOff)
		if err != nil || !accepted {
			return err
		}
		// Accepted: join as the node with the token of its new ramdisk entry, no reboot.
		fmt.Fprintf(console, "%s accepted: joining the control plane as the node\n", MarkerDiscovery)
		log.InfoContext(ctx, "discovery: accepted; joining", "params", p)
		s.Params = p
	}

	// One key for every join attempt: a join whose answer was lost can be retried with the
	// one-time token by the same key (the control plane allows that for a while).
	key, _, err := pki.NewKeyAndCSR("bcd ramdisk")
	if err != nil {
		return fmt.Errorf("generating the node key: %w", err)
	}
	cmds.SetKey(key)
	cmds.SetSite(s.Params.SiteURL)
	lcfg := agentlink.Config{
		Key:            key,
		GatewayURL:     s.Params.GatewayURL,
		CAPEM:          s.Params.CAPEM,
		Kind:           agentlink.KindNode,
		DiscoveryToken: s.Params.Token,
		Hints:          hints,
		DataDir:        "", // RAM: a reboot is a new identity anyway
		Logger:         log,
		AgentVersion:   "bcd-ramdisk",
		Capabilities:   cmds.Kinds(),
	}
	if cfg.Link != nil {
		cfg.Link(&lcfg)
	}
	delay := cfg.RetryDelay
	var link *agentlink.Link
	for {
		link, err = agentlink.Dial(ctx, lcfg, cmds)
		if err == nil {
			break
		}
		if errors.Is(err, agentlink.ErrRefused) {
			fmt.Fprintf(console, "bcd-ramdisk: the gateway refused this machine's token: %v\n", err)
			return fmt.Errorf("joining the control plane: %w", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("joining the control plane: %w", ctx.Err())
		}
		if agentlink.UntrustedGateway(err) {
			fmt.Fprintf(console, "bcd-ramdisk: the gateway's certificate is from a CA this ramdisk does not trust (bcd.ca on its command line; the agent CA rotated?): %v; retrying in %s\n", err, delay)
		} else {
			fmt.Fprintf(console, "bcd-ramdisk: gateway not reachable yet (%v); retrying in %s\n", err, delay)
		}
		log.WarnContext(ctx, "join failed; retrying", "err", err, "in", delay)
		if err := sleep(ctx, delay); err != nil {
			return fmt.Errorf("joining the control plane: %w", err)
		}
		delay = min(delay*2, 30*time.Second)
	}
	fmt.Fprintf(console, "%s node=%s\n", MarkerJoined, link.Identity().NodeID)
	if err := link.Wait(); err != nil {
		fmt.Fprintf(console, "bcd-ramdisk: the link to the control plane ended: %v\n", err)
		return fmt.Errorf("connected to the control plane: %w", err)
	}
	return nil
}

// discover reports the self-asserted inventory and waits for ctx or the decision to join.
func discover(ctx context.Context, console io.Writer, log *slog.Logger, p BootParams, cfg Config, h agentlink.NodeHints, inv inventory.Inventory, ierr error, off PowerOffer) (BootParams, bool, error) {
	retry := cfg.RetryDelay
	disks := make([]string, 0, len(inv.Disks))
	for _, d := range inv.Disks {
		disks = append(disks, fmt.Sprintf("%s:%d", d.Name, d.SizeBytes))
	}
	fmt.Fprintf(console, "%s systemUuid=%s macs=%s disks=%s (self-asserted; waiting for an operator to accept or reject this machine)\n",
		MarkerDiscovery, h.ProductUUID, strings.Join(h.MACs, ","), strings.Join(disks, ","))
	if ierr != nil {
		log.WarnContext(ctx, "discovery: inventory incomplete", "err", ierr)
	} else {
		log.InfoContext(ctx, "discovery: self-asserted inventory", "inventory", NewInventoryResult(inv))
	}
	if p.ReportURL != "" {
		doc := NewDiscoveryReport(p.BootMAC, h, inv)
		delay := retry
		for {
			err := PostDiscoveryReport(ctx, http.DefaultClient, p.ReportURL, doc)
			if err == nil {
				fmt.Fprintf(console, "%s reported to the site as %s\n", MarkerDiscovery, p.BootMAC)
				break
			}
			if ctx.Err() != nil {
				return BootParams{}, false, nil
			}
			log.WarnContext(ctx, "discovery: reporting to the site failed; retrying", "err", err, "in", delay)
			if sleep(ctx, delay) != nil {
				return BootParams{}, false, nil
			}
			delay = min(delay*2, 30*time.Second)
		}
		for {
			jp, v, err := AskDecision(ctx, http.DefaultClient, p.ReportURL, p.BootMAC)
			switch {
			case err != nil:
				log.DebugContext(ctx, "discovery: asking for the decision failed", "err", err)
			case v == VerdictJoin:
				return jp, true, nil
			case v == VerdictReject:
				fmt.Fprintf(console, "%s rejected by an operator: powering off\n", MarkerDiscovery)
				log.InfoContext(ctx, "discovery: rejected; powering off")
				if off == nil {
					log.WarnContext(ctx, "discovery: no way to power off here; waiting")
				} else if err := off.PowerOff(ctx); err != nil {
					fmt.Fprintf(console, "bcd-ramdisk: powering off failed: %v\n", err)
					log.ErrorContext(ctx, "discovery: powering off failed; waiting", "err", err)
				}
				<-ctx.Done()
				return BootParams{}, false, nil
			}
			if sleep(ctx, cfg.DecisionPoll) != nil {
				return BootParams{}, false, nil
			}
		}
	}
	<-ctx.Done()
	return BootParams{}, false, nil
}

// Verdict is a discovery-mode machine's decision as the site tells it.
type Verdict int

const (
	VerdictPending Verdict = iota // no decision to act on yet
	VerdictJoin                   // accepted: join with the returned parameters
	VerdictReject                 // rejected: power off
)

// AskDecision asks the site (GET reportURL/decision?mac=bootMAC, netboot.DecisionPath) for the
// machine's decision: VerdictJoin with the join parameters of its ramdisk entry's command line
// once it was accepted, VerdictReject (410) once it was rejected, else VerdictPending. Errors
// never contain the token.
func AskDecision(ctx context.Context, c *http.Client, reportURL, bootMAC string) (BootParams, Verdict, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, reportURL+"/decision?mac="+url.QueryEscape(bootMAC), nil)
	if err != nil {
		return BootParams{}, VerdictPending, fmt.Errorf("decision request: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return BootParams{}, VerdictPending, fmt.Errorf("asking the site for the decision: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCmdline+1))
	if err != nil {
		return BootParams{}, VerdictPending, fmt.Errorf("reading the decision: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusNoContent:
		return BootParams{}, VerdictPending, nil
	case http.StatusGone:
		return BootParams{}, VerdictReject, nil
	case http.StatusOK:
	default:
		return BootParams{}, VerdictPending, fmt.Errorf("the site answered the decision request with %s", resp.Status)
	}
	jp, err := ParseCmdline(string(body))
	if err != nil {
		return BootParams{}, VerdictPending, fmt.Errorf("the decision: %w", err)
	}
	if jp.Mode != ModeJoin {
		return BootParams{}, VerdictPending, fmt.Errorf("the decision is not a ramdisk entry with a token (mode %s)", jp.Mode)
	}
	return jp, VerdictJoin, nil
}

// DiscoveryReport is what a discovery-mode ramdisk posts to the site (netboot.DiscoveryPath):
// self-asserted, a summary that fits netboot.MaxDiscoveryReport.
type DiscoveryReport struct {
	BootMAC    string             `json:"bootMac"`
	SystemUUID string             `json:"systemUuid,omitempty"`
	MACs       []string           `json:"macs"`
	CPU        inventory.CPU      `json:"cpu"`
	Memory     inventory.Memory   `json:"memory"`
	Disks      []DiscoveryDisk    `json:"disks"`
	DMI        inventory.DMI      `json:"dmi"`
	BootMode   inventory.BootMode `json:"bootMode,omitempty"`
}

// DiscoveryDisk is one disk of a DiscoveryReport.
type DiscoveryDisk struct {
	Name      string `json:"name"`
	Model     string `json:"model,omitempty"`
	Serial    string `json:"serial,omitempty"`
	SizeBytes uint64 `json:"sizeBytes"`
}

// NewDiscoveryReport summarises the inventory for the site. Pure.
func NewDiscoveryReport(bootMAC string, h agentlink.NodeHints, inv inventory.Inventory) DiscoveryReport {
	r := DiscoveryReport{BootMAC: bootMAC, SystemUUID: h.ProductUUID, MACs: h.MACs, CPU: inv.CPU, Memory: inv.Memory, DMI: inv.DMI, BootMode: inv.BootMode, Disks: []DiscoveryDisk{}}
	if r.MACs == nil {
		r.MACs = []string{}
	}
	for _, d := range inv.Disks {
		r.Disks = append(r.Disks, DiscoveryDisk{Name: d.Name, Model: d.Model, Serial: d.Serial, SizeBytes: d.SizeBytes})
	}
	return r
}

// PostDiscoveryReport posts the report to the site's discovery URL.
func PostDiscoveryReport(ctx context.Context, c *http.Client, url string, r DiscoveryReport) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding the discovery report: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("discovery report: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("posting the discovery report: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("the site refused the discovery report: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
