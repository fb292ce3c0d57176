// Package gateway is the control plane's side of the agent protocol (bcd.agent.v1): site
// agents and ramdisks join with a one-time token, then keep one mTLS Connect stream open over
// which commands flow down and acknowledgements, progress, results and status flow up.
//
// The gateway relays; it decides nothing about commands. It consumes two small interfaces that
// the control plane implements over its store: Queue (which commands an agent runs, and what
// became of them) and Identities (join tokens, node identity generations). It never forges or
// alters an attested result: result_json, node_sig and signer_cert_der are passed to
// Queue.Update exactly as received, and the store verifies them (pki.VerifyStatement).
//
// # One stream
//
// A stream has one sender goroutine and one receiver goroutine. The sender claims work when the
// queue signals it (Queue.Notify) or, as a fallback, PollInterval after its last claim, and
// packs up to BatchSize commands into one frame; at most Window commands are in flight (sent,
// not yet acknowledged) at once, so a slow agent is never flooded. It also admits the stream's
// certificate again every RecheckInterval. The receiver spreads acks and updates over Lanes
// lanes keyed by command id: one command's messages stay in order while different commands
// reach the store concurrently (group commit). A lane's goroutine runs only while the lane
// holds something, so an idle stream costs its two goroutines. A node's stream (ramdisk,
// installed OS: a command or two at a time) has one lane. An update is answered with an
// UpdateAck only once the queue accepted it; the agent re-sends unanswered final updates on its
// next stream, so a dropped connection loses nothing.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"bcd/internal/pki"
)

// AgentRef names a connected agent by its verified certificate identity.
type AgentRef struct {
	Kind       pki.Kind
	SiteID     string // site agents
	AgentID    string // site agents
	NodeID     string // nodes, node tenants
	Generation uint64 // nodes, node tenants
}

// String is the agent's identity URI (bcd://site-agent/s/a, bcd://node/n/3…).
func (a AgentRef) String() string { return a.identity().URI() }

func (a AgentRef) identity() pki.Identity {
	switch a.Kind {
	case pki.KindSiteAgent:
		return pki.SiteAgentIdentity(a.SiteID, a.AgentID)
	default:
		return pki.Identity{Kind: a.Kind, NodeID: a.NodeID, Generation: a.Generation}
	}
}

// RefOf is the AgentRef of a verified identity. A node-tenant's tenant ID is not part of it:
// the queue addresses the node.
func RefOf(id pki.Identity) AgentRef {
	return AgentRef{Kind: id.Kind, SiteID: id.SiteID, AgentID: id.AgentID, NodeID: id.NodeID, Generation: id.Generation}
}

// Command is one unit of work for an agent.
type Command struct {
	ID         string
	Kind       string // bmc.power, disk.wipe…
	NodeID     string
	Generation uint64 // the node's identity generation the command was made for
	Args       []byte // JSON
	Deadline   time.Time
}

// Command states an agent reports.
const (
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	// StateLost: the agent reported the command interrupted (it stopped while the command was
	// in progress): it may have taken effect and is never run again.
	StateLost = "lost"
)

// Update is what an agent reports about a command. Result, NodeSig and SignerCertDER are the
// agent's bytes, unchanged.
type Update struct {
	CommandID       string
	State           string // StateRunning, StateSucceeded, StateFailed, StateLost
	ProgressDone    int64
	ProgressTotal   int64
	ProgressMessage string
	Result          []byte
	Error           string
	NodeSig         []byte
	SignerCertDER   []byte
}

// Final reports whether the update ends the command.
func (u Update) Final() bool {
	return u.State == StateSucceeded || u.State == StateFailed || u.State == StateLost
}

// Hello is the first message of a stream.
type Hello struct {
	AgentVersion string
	Capabilities []string
	Drivers      []string
	// ResumeAfter is the last command the agent journaled, when it came from the store and
	// fence of StoreWatermark (else empty): a store at that fence without it was restored from
	// a backup taken before it was sent.
	ResumeAfter string
	// StoreWatermark is the newest watermark of the store the agent was told (zero: none).
	StoreWatermark Watermark
	// CAs: the fingerprints (pki.Fingerprint) of the CA certificates the agent trusts (none: an
	// agent older than agent CA rotation).
	CAs []string
}

// Watermark is a store's watermark (store.Watermark): its id, fences and beats. Agents keep
// the newest they were told; a store behind one an agent names was restored from an older
// backup.
type Watermark struct {
	StoreID       string
	Fences, Beats int64
}

// Discovered is a machine a site agent saw PXE-booting with no boot entry (Inventory: what a
// discovery-mode ramdisk on it reported, self-asserted).
type Discovered struct {
	MAC, UUID, Arch     string
	FirstSeen, LastSeen time.Time
	Inventory           string
}

// Status is an agent's periodic report.
type Status struct {
	HoldsBootLease bool
	Discovered     []Discovered
	Drivers        []string
	Facts          map[string]string
	// Withheld: boot scripts the agent's boot binding withheld, per MAC and requesting address,
	// while seen in the last 10 minutes (at most MaxWithheldBoots).
	Withheld []WithheldBoot
}

// WithheldBoot is the requests for a MAC's boot script from an address its site's DHCP did not
// see that MAC take: Count of them, from First to Last.
type WithheldBoot struct {
	MAC         string // lower case, colon-separated
	Remote      netip.Addr
	Count       int
	First, Last time.Time
}

// MaxWithheldBoots bounds the withheld pairs one status report carries.
const MaxWithheldBoots = 256

// NodeHints is what a ramdisk reports about itself at Join.
type NodeHints struct {
	ProductUUID string
	MACs        []string
}

// Queue is the command queue as the gateway sees it. Every method is called with the identity
// of the agent on the stream; implementations refuse what that agent may not do.
type Queue interface {
	// Claim returns up to limit commands this agent should run now (already-assigned but
	// unacknowledged ones first, e.g. after a reconnect), assigning them to it atomically.
	// Between two Connected calls for an agent, Claim returns a command at most once: the
	// commands in flight on a live stream are not offered again; Connected (a new stream) makes
	// the agent's assigned-but-unacknowledged commands due again.
	Claim(ctx context.Context, a AgentRef, limit int) ([]Command, error)
	// AckAll: queued/sent → delivered, for the acknowledgements of one frame together (one
	// write, not one per command); idempotent. It returns the refused ones by id (ErrRejected:
	// unknown, or not this agent's); an error fails them all.
	AckAll(ctx context.Context, a AgentRef, commandIDs []string) (map[string]error, error)
	// Update: running / succeeded / failed (+result, signature); idempotent per (command, state).
	// A final update may arrive without a running one, and (after a lost ack) before the ack.
	Update(ctx context.Context, a AgentRef, u Update) error
	// Notify is signalled when new work may exist for a; the func unsubscribes.
	Notify(a AgentRef) (<-chan struct{}, func())
	Connected(ctx context.Context, a AgentRef, hello Hello) error
	Disconnected(ctx context.Context, a AgentRef) error
	Status(ctx context.Context, a AgentRef, s Status) error
}

// Canceller is optionally implemented by a Queue: commands of this agent that were delivered
// and must be cancelled (an aborted workflow). The gateway asks on every wake-up and sends
// Cancel for each id once per stream.
type Canceller interface {
	Cancels(ctx context.Context, a AgentRef) ([]string, error)
}

// Identities issues agent certificates and knows nodes' identity generations.
type Identities interface {
	// JoinSite consumes a bootstrap token and signs a site-agent certificate for csrDER.
	JoinSite(ctx context.Context, token string, csrDER []byte) (certDER []byte, err error)
	// JoinNode consumes a node's discovery token and signs a node certificate for its
	// current identity generation.
	JoinNode(ctx context.Context, token string, csrDER []byte, hints NodeHints) (certDER []byte, err error)
	// CurrentGeneration is the node's identity generation now.
	CurrentGeneration(ctx context.Context, nodeID string) (uint64, error)
	// Renew certifies again the identity and key of certDER, the caller's verified client
	// certificate (id is its identity, admitted as for Connect). A node identity of an older
	// generation is refused with pki.ErrIdentityRevoked (wrapped).
	Renew(ctx context.Context, id pki.Identity, certDER []byte) (newCertDER []byte, err error)
	// SiteAgentRevoked says whether an operator revoked site agent agentID's certificate.
	SiteAgentRevoked(ctx context.Context, agentID string) (bool, error)
}

// Error is the type of this package's sentinel errors.
type Error string

func (e Error) Error() string { return string(e) }

const (
	// ErrTokenRefused: Identities returns it (wrapped) for an unknown, used or expired token.
	// The agent is told only "token refused", whichever it was.
	ErrTokenRefused Error = "join token refused"
	// ErrRejected: Queue returns it (wrapped) when it refuses an ack or update for good (unknown
	// command, another agent's command, a state that cannot follow the current one). The agent
	// is told and stops re-sending. Any other error is taken as transient: the stream ends and
	// the agent re-sends on its next one.
	ErrRejected Error = "rejected by the queue"
	// ErrNotFound: CurrentGeneration returns it (wrapped) for an unknown node.
	ErrNotFound Error = "not found"
	// ErrStoreBehind: Connected returns it (wrapped, with what the agent saw) when the agent
	// names a newer watermark of the store than the store has. The agent is refused with
	// FAILED_PRECONDITION and the error's text, and tries again later.
	ErrStoreBehind Error = "the control plane's store is behind what the agent saw"
)

// AttestedKinds is the default set of command kinds whose results are signed by the agent that
// ran them (DESIGN §5): node-attested diag.dcgm and disk.wipe, site-signed bmc.rotate.
func AttestedKinds() map[string]bool {
	return map[string]bool{"diag.dcgm": true, "disk.wipe": true, "bmc.rotate": true}
}

// Config is the gateway's configuration. Zero durations and sizes take the defaults.
type Config struct {
	Queue      Queue
	Identities Identities
	// Sites keeps the boot lease and power polling; nil: those calls answer UNIMPLEMENTED (site
	// agents then serve as if alone).
	Sites Sites
	// Consoles relays operators' console sessions; nil: the Console call answers UNIMPLEMENTED.
	Consoles Consoles
	// CA verifies agents' certificates; the certificates it trusts are sent to joining and renewing
	// agents (ca_pem), their fingerprints with every heartbeat answer.
	CA     *pki.CA
	Logger *slog.Logger
	// Attested says whether a command kind's result is signed; default AttestedKinds.
	Attested func(kind string) bool

	BatchSize int // commands per frame; default 256
	Window    int // commands in flight (sent, unacknowledged) per stream; default 4096
	// Lanes: concurrent ack/update lanes per site agent stream (a node's has one); default 64.
	// Each lane waits for the store's write of what it forwards, so a site agent's commands
	// advance at most Lanes writes at a time: with 8, 1 000 simulated machines enrolled at 66–84
	// a second over the gateway; with 64 (nothing else changed), at 90–101.
	Lanes        int
	PollInterval time.Duration // claim without a Notify signal this long after the last claim; default 2s
	// IdlePollInterval bounds how far a node's stream (ramdisk, installed OS) stretches its
	// poll while its polls find nothing: each such poll doubles the next one's wait, and a
	// signal or a claim that finds work brings it back to PollInterval (nextPoll). A fleet's
	// installed OSes stay connected for as long as they run, with nothing to take: 10 000 of
	// them polling every 2 s were 5 000 claims a second, a store read each. Default 16 ×
	// PollInterval (32 s).
	IdlePollInterval time.Duration
	// RecheckInterval: an open stream's certificate is admitted again this often (a site
	// agent revoked, a node's identity generation bumped, the certificate expired): one
	// refused ends the stream.
	// Default 30s.
	RecheckInterval time.Duration
	// IdleTimeout ends a stream from which nothing was received for that long; default 45s
	// (agents heartbeat every 10s by default).
	IdleTimeout time.Duration
	// MaxMessageBytes bounds one received frame; default 16 MiB.
	MaxMessageBytes int
	// Now is the clock that client certificates are checked against at every request and
	// re-check; default time.Now.
	Now func() time.Time
	// Watermark, when set, is the store's watermark as the control plane last counted it
	// (false: none yet); heartbeat answers carry it to the agents.
	Watermark func() (Watermark, bool)
}

func (c *Config) setDefaults() error {
	if c.Queue == nil || c.Identities == nil || c.CA == nil {
		return errors.New("configuring agent gateway: Queue, Identities and CA are required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Attested == nil {
		kinds := AttestedKinds()
		c.Attested = func(k string) bool { return kinds[k] }
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.BatchSize, 256)
	def(&c.Window, 4096)
	def(&c.Lanes, 64)
	def(&c.MaxMessageBytes, 16<<20)
	defd(&c.PollInterval, 2*time.Second)
	defd(&c.IdlePollInterval, 16*c.PollInterval)
	defd(&c.IdleTimeout, 45*time.Second)
	defd(&c.RecheckInterval, 30*time.Second)
	if c.IdlePollInterval < c.PollInterval {
		return fmt.Errorf("configuring agent gateway: IdlePollInterval %s shorter than PollInterval %s", c.IdlePollInterval, c.PollInterval)
	}
	if c.Window < c.BatchSize {
		return fmt.Errorf("configuring agent gateway: Window %d smaller than BatchSize %d", c.Window, c.BatchSize)
	}
	return nil
}
