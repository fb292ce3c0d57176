// Package agentlink is the agent side of the gateway protocol (bcd.agent.v1), shared by the
// site agent and the ramdisk: it joins once (one-time token + CSR → certificate), then keeps
// one mTLS Connect stream to the gateway up, reconnecting with exponential backoff and
// jitter, and runs the commands it receives through a Handler.
//
// # At most once
//
// A command is acknowledged only after its id is recorded in the journal (DataDir/journal,
// fsync'd; group commit, so a batch of commands costs one fsync). A command whose id is in
// the journal is never run again: when the server offers it again (its ack was lost) the agent
// acknowledges it again and re-sends its recorded final update. A command runs only once the
// server answered its ack (AckResult): an ack lost in flight (the stream broke, the agent
// died) leaves the command unacknowledged on the server, which may give it to another agent of
// the site — so it must not have run here. Acks the server has not answered are sent again on
// every new stream. A command's start is journaled (fsync'd) before it runs: at the next start
// after a crash, a command that had started and not finished is reported interrupted (it may
// have run), never run again; one that had not started is acknowledged again and runs if the
// server still answers that it is the agent's (not given to another agent, not declared lost).
// Final updates are recorded before they are sent and re-sent on every new stream until the
// server answers them (UpdateAck), so a broken stream loses nothing.
//
// # Attested results
//
// For commands the server marks attest (disk.wipe, diag.dcgm, bmc.rotate), agentlink signs the
// result with the agent's key, pki.SignStatement over pki.Statement{CommandID, NodeID, Kind,
// Generation, pki.ResultDigest(result)}, and sends its certificate with the signature. The
// result bytes are sent exactly as the Handler returned them.
package agentlink

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"bcd/internal/gateway"
)

// Kind says which identity an agent joins as.
type Kind int

const (
	KindSite Kind = iota + 1 // a site agent: JoinToken
	KindNode                 // a ramdisk or node agent: DiscoveryToken
)

func (k Kind) String() string {
	switch k {
	case KindSite:
		return "site"
	case KindNode:
		return "node"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// NodeHints is what a ramdisk reports about itself at join.
type NodeHints struct {
	ProductUUID string
	MACs        []string
}

// Command is one command from the control plane.
type Command struct {
	ID         string
	Kind       string
	NodeID     string
	Generation uint64
	Args       []byte // JSON
	Deadline   time.Time
	Attest     bool // the result is signed
}

// Progress is what a Handler reports while it runs.
type Progress struct {
	Done, Total int64
	Message     string
}

// Command states.
const (
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	// StateInterrupted: the agent stopped while the command was in progress (it may have run);
	// reported by the next start, never run again.
	StateInterrupted = "interrupted"
)

// Update is what agentlink sends about a command.
type Update struct {
	CommandID     string
	State         string
	Progress      Progress
	Result        []byte
	Error         string
	NodeSig       []byte
	SignerCertDER []byte
}

func (u Update) final() bool {
	return u.State == StateSucceeded || u.State == StateFailed || u.State == StateInterrupted
}

// Handler runs commands. Run is called at most once per command id, concurrently for
// different commands; ctx ends at the command's deadline, on Cancel, or when the agent stops.
// A nil error means succeeded with result (JSON); an error means failed (result may still
// say what was done).
type Handler interface {
	Run(ctx context.Context, cmd Command, report func(Progress)) (result []byte, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, cmd Command, report func(Progress)) ([]byte, error)

// Run calls f.
func (f HandlerFunc) Run(ctx context.Context, cmd Command, report func(Progress)) ([]byte, error) {
	return f(ctx, cmd, report)
}

// Discovered is a machine a site agent saw PXE-booting with no boot entry; Inventory is what a
// discovery-mode ramdisk on it reported (compact JSON, "" when none).
type Discovered struct {
	MAC, UUID, Arch     string
	FirstSeen, LastSeen time.Time
	Inventory           string
}

// Status is the agent's latest report; SetStatus sends it now and on every new stream.
type Status struct {
	HoldsBootLease bool
	Discovered     []Discovered
	Drivers        []string
	Facts          map[string]string
	// Withheld: boot scripts the boot binding withheld (site agents), at most
	// gateway.MaxWithheldBoots.
	Withheld []gateway.WithheldBoot
}

// Config configures a link. Zero durations and sizes take the defaults.
type Config struct {
	// GatewayURL is https://host:port of the agent gateway.
	GatewayURL string
	// ServerName is the TLS name to check; default the host of GatewayURL.
	ServerName string
	// Dial makes the connections to the gateway (TLS runs over them); nil dials TCP to
	// GatewayURL's host and port. bcd sim gives the in-memory network of the server it runs
	// (memnet).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// CAPEM is the CA the agent trusts before it has joined (from its configuration or the
	// kernel command line). Not needed when DataDir already holds ca.pem.
	CAPEM []byte
	// DataDir holds the key, certificate, CA and journal (files 0600). Empty: everything in
	// RAM (the ramdisk: a reboot is a new identity anyway).
	DataDir string
	Kind    Kind
	// JoinToken (site) or DiscoveryToken (node): used once, when DataDir has no certificate,
	// or has one that expired (the agent joins again, keeping DataDir).
	JoinToken      string
	DiscoveryToken string
	// Key, when set, is the key to join with (an ECDSA P-256 key the agent keeps across join
	// attempts); default: a new key per join.
	Key    crypto.Signer
	Hints  NodeHints
	Logger *slog.Logger

	AgentVersion string
	Capabilities []string
	Drivers      []string

	HeartbeatInterval time.Duration // default 10s; the stream is declared dead after 3 silent intervals
	MinBackoff        time.Duration // default 250ms
	MaxBackoff        time.Duration // default 30s
	MaxConcurrent     int           // commands running at once; default 64
	// Sessions are command kinds that run beside the MaxConcurrent slots: an operator's
	// interactive session (bmc.console) lasts as long as the operator stays, and must not hold
	// a slot the workflows' commands need. The handler bounds them itself.
	Sessions []string
	// JournalRetain is how many confirmed command ids the journal keeps (a command re-sent
	// after its id was forgotten would run again); default 100,000.
	JournalRetain int
	// MaxMessageBytes bounds one received frame; default 16 MiB.
	MaxMessageBytes int
	// Received, when set, is called with each frame's commands before the link journals or
	// acknowledges them. Nil in a real agent: bcd sim kills agents from it (Link.Crash).
	Received func(*Link, []Command)
}

func (c *Config) setDefaults() error {
	if c.GatewayURL == "" {
		return errors.New("configuring agent link: GatewayURL is required")
	}
	if c.Kind != KindSite && c.Kind != KindNode {
		return fmt.Errorf("configuring agent link: unknown kind %v", c.Kind)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 250 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 64
	}
	if c.JournalRetain <= 0 {
		c.JournalRetain = 100_000
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 16 << 20
	}
	return nil
}

// Error is the type of this package's sentinel errors.
type Error string

func (e Error) Error() string { return string(e) }

const (
	// ErrRefused: the gateway refused the agent's credentials (token at join, certificate at
	// connect: unknown, revoked generation…). The link stops: retrying cannot help.
	ErrRefused Error = "refused by the gateway"
	// ErrCrashed: the link was killed (Link.Crash).
	ErrCrashed Error = "agent crashed"
	// errJournalCorrupt: damage before the journal's last record.
	errJournalCorrupt Error = "journal corrupt"
)
