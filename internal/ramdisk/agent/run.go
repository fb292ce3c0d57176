package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
// Discovery mode (bcd.mode=discovery, no token) has no identity to join with, and the control
// plane cannot accept discovered machines yet: the agent prints its self-asserted inventory
// (product UUID, MACs, disks) on the console and in the log, and waits.
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
		return discover(ctx, console, log, hints, inv, ierr)
	}

	// One key for every join attempt: a join whose answer was lost can be retried with the
	// one-time token by the same key (the control plane allows that for a while).
	key, _, err := pki.NewKeyAndCSR("bcd ramdisk")
	if err != nil {
		return fmt.Errorf("generating the node key: %w", err)
	}
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
		fmt.Fprintf(console, "bcd-ramdisk: gateway not reachable yet (%v); retrying in %s\n", err, delay)
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

// discover reports the self-asserted inventory and waits for ctx.
func discover(ctx context.Context, console io.Writer, log *slog.Logger, h agentlink.NodeHints, inv inventory.Inventory, ierr error) error {
	disks := make([]string, 0, len(inv.Disks))
	for _, d := range inv.Disks {
		disks = append(disks, fmt.Sprintf("%s:%d", d.Name, d.SizeBytes))
	}
	fmt.Fprintf(console, "%s systemUuid=%s macs=%s disks=%s (self-asserted; waiting: the control plane does not accept discovered machines yet)\n",
		MarkerDiscovery, h.ProductUUID, strings.Join(h.MACs, ","), strings.Join(disks, ","))
	if ierr != nil {
		log.WarnContext(ctx, "discovery: inventory incomplete", "err", ierr)
	} else {
		log.InfoContext(ctx, "discovery: self-asserted inventory", "inventory", NewInventoryResult(inv))
	}
	<-ctx.Done()
	return nil
}
