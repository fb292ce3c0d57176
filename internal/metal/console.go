package metal

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"bcd/internal/auth"
	"bcd/internal/command"
	"bcd/internal/store"
)

// Console session lengths: the default, and the most an operator may ask for.
const (
	DefaultConsoleDuration = time.Hour
	MaxConsoleDuration     = 24 * time.Hour
)

// IPMIPort is where a BMC serves IPMI over LAN (RMCP+), and so Serial-over-LAN.
const IPMIPort = 623

// ConsoleInput is an operator's request for a node's serial console.
type ConsoleInput struct {
	Node     string
	Reason   string
	TakeOver bool
	ReadOnly bool
	// Max is how long the session may last (0: DefaultConsoleDuration).
	Max time.Duration
	// Server is the id of the server that holds the session: only site agents connected to it
	// take the command (their console stream must reach it). "": any.
	Server string
}

// ConsoleBMC is the BMC binding a node's console session uses: IPMI Serial-over-LAN at the
// node's IPMI BMC, or, for a node managed by Redfish whose hardware profile binds console=ipmi,
// at the Redfish service's host on IPMIPort with the same credentials. Redfish itself has no
// standard serial console. Pure.
func ConsoleBMC(n store.Node, profileDrivers map[string]string) (store.BMCRef, error) {
	ref := n.BMC()
	if ref.Address == "" {
		return store.BMCRef{}, invalid("node", "node %s has no BMC address yet (enrolled in-band, before its BMC was provisioned): it has no console", n.Name)
	}
	switch ref.Driver {
	case "ipmi":
		return ref, nil
	case "redfish":
		if profileDrivers["console"] != "ipmi" {
			return store.BMCRef{}, invalid("node", "node %s is managed by Redfish, which has no standard serial console, and its hardware profile binds none: "+
				"bind console=ipmi in the profile (IPMI Serial-over-LAN on the BMC's host, port %d, with the same credentials)", n.Name, IPMIPort)
		}
		u, err := url.Parse(ref.Address)
		if err != nil || u.Hostname() == "" {
			return store.BMCRef{}, fmt.Errorf("node %s: its Redfish address does not parse: %v", n.Name, err)
		}
		return store.BMCRef{Driver: "ipmi", Address: net.JoinHostPort(u.Hostname(), strconv.Itoa(IPMIPort)),
			UsernameRef: ref.UsernameRef, PasswordRef: ref.PasswordRef}, nil
	}
	return store.BMCRef{}, invalid("node", "node %s's BMC driver %q has no console", n.Name, truncate(ref.Driver))
}

// OpenConsole queues a bmc.console command for a site agent of the node's site and records the
// session's opening as an event naming who opened it, in one transaction. The command's id
// names the session; the caller opens it (package console) before any agent can attach. The
// node may be in any state: a console is most wanted while a workflow runs, or after it failed.
func (s *Service) OpenConsole(ctx context.Context, p auth.Principal, in ConsoleInput) (store.Node, store.Command, error) {
	if err := Require(p, auth.Operate); err != nil {
		return store.Node{}, store.Command{}, err
	}
	if in.Node == "" {
		return store.Node{}, store.Command{}, invalid("node", "is required: a node id or name")
	}
	if err := ValidReason(in.Reason); err != nil {
		return store.Node{}, store.Command{}, err
	}
	switch {
	case in.Max == 0:
		in.Max = DefaultConsoleDuration
	case in.Max < time.Minute || in.Max > MaxConsoleDuration:
		return store.Node{}, store.Command{}, invalid("max_seconds", "%s: a console session lasts 1 minute to %s", in.Max, MaxConsoleDuration)
	}
	kind, err := command.Lookup("bmc.console")
	if err != nil {
		return store.Node{}, store.Command{}, err
	}
	var node store.Node
	var cmd store.Command
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, in.Node, p.TenantID)
		if err != nil {
			return err
		}
		drivers := map[string]string{}
		if n.BMCDriver != "ipmi" {
			pool, err := tx.Pool(ctx, n.PoolID)
			if err != nil {
				return fmt.Errorf("reading the pool of node %s: %w", n.Name, err)
			}
			hp, err := tx.HardwareProfile(ctx, pool.Policy.HardwareProfile)
			if err != nil {
				return fmt.Errorf("pool %s names hardware profile %q, which does not exist: %w", pool.Name, pool.Policy.HardwareProfile, store.ErrNotFound)
			}
			drivers = hp.Drivers
		}
		ref, err := ConsoleBMC(n, drivers)
		if err != nil {
			return err
		}
		open, err := tx.OpenConsolesOf(ctx, n.ID)
		if err != nil {
			return err
		}
		own := false
		for _, c := range open {
			by, held := consoleHolder(c)
			switch {
			case by == p.Actor():
				own = true
			case !in.TakeOver:
				return &ConflictError{Msg: fmt.Sprintf("the console of node %s is open already: %s; take it over (--take-over ends that session), or wait for it to end", n.Name, held)}
			}
		}
		if own {
			// The caller's own session, ending or left behind: the new one takes the BMC's
			// payload from it rather than fail on it.
			in.TakeOver = true
		}
		cmd = store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: kind.Name, Subject: "bmc:" + n.BMCAddress,
			Args: jsonObject(map[string]any{"bmc": ref, "takeOver": in.TakeOver, "server": in.Server, "by": p.Actor(), "readOnly": in.ReadOnly}), RunsOn: string(kind.RunsOn),
			Destructive: kind.Destructive, Reroutable: kind.Reroutable, Generation: n.IdentityGeneration,
			Deadline: tx.At() + in.Max.Microseconds()}
		if err := tx.InsertCommand(ctx, &cmd); err != nil {
			return err
		}
		node = n
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.console",
			FromState: n.State, ToState: n.State, Reason: in.Reason,
			Data: jsonObject(map[string]any{"command": cmd.ID, "bmc": ref.Address, "readOnly": in.ReadOnly, "takeOver": in.TakeOver, "maxSeconds": int64(in.Max.Seconds())})})
	})
	return node, cmd, err
}

// CloseConsole records a session's end as an event: who had it, how long, how much crossed it,
// and why it ended. A command no site agent took yet is withdrawn: nothing would relay it.
func (s *Service) CloseConsole(ctx context.Context, p auth.Principal, n store.Node, commandID string, took time.Duration, bytesIn, bytesOut int64, why string) error {
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if _, _, err := tx.WithdrawCommand(ctx, commandID, "withdrawn: the operator's console session ended ("+why+") before a site agent took it"); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.console.closed",
			FromState: n.State, ToState: n.State, Data: jsonObject(map[string]any{"command": commandID, "seconds": int64(took.Seconds()),
				"bytesIn": bytesIn, "bytesOut": bytesOut, "ended": why})})
	})
}

// consoleHolder says who holds an open console session, from its command: the actor, and a
// line naming the session for an error. Pure.
func consoleHolder(c store.Command) (by, line string) {
	var args struct {
		By       string `json:"by"`
		ReadOnly bool   `json:"readOnly"`
	}
	_ = json.Unmarshal([]byte(c.Args), &args)
	mode := ""
	if args.ReadOnly {
		mode = " (read-only)"
	}
	return args.By, fmt.Sprintf("session %s of %s%s since %s", c.ID, cmp.Or(args.By, "someone"), mode, time.UnixMicro(c.CreatedAt).UTC().Format(time.RFC3339))
}
