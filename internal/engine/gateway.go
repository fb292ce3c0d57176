package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"bcd/internal/command"
	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
)

// Gateway adapts the engine to the agent gateway's Queue and Identities interfaces.
type Gateway struct{ e *Engine }

// Gateway returns the adapter the agent gateway consumes.
func (e *Engine) Gateway() *Gateway { return &Gateway{e: e} }

type connKey struct{}

type conn struct {
	id   string
	cert []byte
	// issuer is the fingerprint of the CA that verified cert in the TLS handshake (the chain's
	// second certificate); "" when the connection did not say (then the CA is looked up again).
	issuer string
}

// Wrap gives every HTTP request (one agent stream) a connection id and the peer certificate, so
// Connected and Disconnected of one stream are paired and secrets can be encrypted to the peer.
func (g *Gateway) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 8)
		rand.Read(b)
		c := conn{id: hex.EncodeToString(b)}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			c.cert = r.TLS.PeerCertificates[0].Raw
		}
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 1 {
			c.issuer = pki.Fingerprint(r.TLS.VerifiedChains[0][1].Raw)
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), connKey{}, c)))
	})
}

// RoleOS is the capability an installed OS's agent announces in its hello (as opposed to the
// ramdisk): its arrival completes await-rejoin steps.
const RoleOS = "role:os"

// agentOf is the engine's view of a gateway agent. A node-tenant certificate is the installed
// OS's, whatever its hello says: only the node's own certificate can be its ramdisk (which runs
// and attests the node's commands).
func agentOf(ctx context.Context, a gateway.AgentRef, os bool) Agent {
	os = os || a.Kind == pki.KindNodeTenant
	c, _ := ctx.Value(connKey{}).(conn)
	switch a.Kind {
	case pki.KindSiteAgent:
		return Agent{ID: a.AgentID, Kind: "site", SiteID: a.SiteID, ConnID: c.id, CertDER: c.cert}
	default:
		kind := "node"
		if os {
			kind = "os"
		}
		return Agent{ID: NodeAgentID(kind, a.NodeID), Kind: kind, NodeID: a.NodeID, Generation: a.Generation, ConnID: c.id, CertDER: c.cert}
	}
}

// NodeAgentID is the id of node nodeID's agent of kind "node" (its ramdisk) or "os" (its
// installed OS): one per node and kind, whatever the boot; each connection has an id of its own.
func NodeAgentID(kind, nodeID string) string { return kind + ":" + nodeID }

// roles remembers, per connection, whether the node agent announced itself as the OS.
func (g *Gateway) agent(ctx context.Context, a gateway.AgentRef) Agent {
	c, _ := ctx.Value(connKey{}).(conn)
	g.e.sentMu.Lock()
	os := g.e.osConns[c.id]
	g.e.sentMu.Unlock()
	return agentOf(ctx, a, os)
}

func (g *Gateway) Claim(ctx context.Context, a gateway.AgentRef, limit int) ([]gateway.Command, error) {
	ag := g.agent(ctx, a)
	if ag.Kind == "os" {
		return nil, nil // an installed OS runs no commands
	}
	cmds, err := g.e.Claim(ctx, ag, limit)
	if err != nil {
		return nil, err
	}
	out := make([]gateway.Command, len(cmds))
	for i, c := range cmds {
		out[i] = gateway.Command{ID: c.ID, Kind: c.Kind, NodeID: c.NodeID, Generation: c.Generation, Args: []byte(c.Args), Deadline: time.UnixMicro(c.Deadline)}
	}
	return out, nil
}

func rejected(err error) error {
	if errors.Is(err, ErrNotYours) || errors.Is(err, ErrFinished) || errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %v", gateway.ErrRejected, err)
	}
	return err
}

// AckAll records a frame's acknowledgements in one write.
func (g *Gateway) AckAll(ctx context.Context, a gateway.AgentRef, ids []string) (map[string]error, error) {
	refused, err := g.e.AckAll(ctx, g.agent(ctx, a), ids)
	if err != nil {
		return nil, err
	}
	for id, err := range refused {
		refused[id] = rejected(err)
	}
	return refused, nil
}

func (g *Gateway) Update(ctx context.Context, a gateway.AgentRef, u gateway.Update) error {
	return rejected(g.e.Report(ctx, g.agent(ctx, a), Update{CommandID: u.CommandID, State: u.State, ProgressDone: u.ProgressDone,
		ProgressTotal: u.ProgressTotal, ProgressMessage: u.ProgressMessage, Result: u.Result, Error: u.Error, NodeSig: u.NodeSig, SignerCertDER: u.SignerCertDER}))
}

// Cancels implements gateway.Canceller: the commands of the agent that the engine gave up
// (an aborted workflow, a step out of time) while the agent held them.
func (g *Gateway) Cancels(ctx context.Context, a gateway.AgentRef) ([]string, error) {
	ag := g.agent(ctx, a)
	if ag.Kind == "os" {
		return nil, nil // runs no commands
	}
	return g.e.Cancels(ag), nil
}

var _ gateway.Canceller = (*Gateway)(nil)

func (g *Gateway) Notify(a gateway.AgentRef) (<-chan struct{}, func()) {
	return g.e.Subscribe(agentOf(context.Background(), a, false))
}

func (g *Gateway) Connected(ctx context.Context, a gateway.AgentRef, hello gateway.Hello) error {
	os := slices.Contains(hello.Capabilities, RoleOS)
	ag := agentOf(ctx, a, os)
	seen := hello.StoreWatermark
	if err := g.e.Witness(ctx, ag, store.Watermark{StoreID: seen.StoreID, Fences: seen.Fences, Beats: seen.Beats}, hello.ResumeAfter); err != nil {
		if errors.Is(err, ErrStoreBehind) {
			return fmt.Errorf("%w: %w", gateway.ErrStoreBehind, err)
		}
		return err
	}
	// The role is kept for the connection's later calls only once it is recorded: a refused
	// connection gets no Disconnected to forget it.
	c, ok := ctx.Value(connKey{}).(conn)
	if ok && os {
		g.e.sentMu.Lock()
		g.e.osConns[c.id] = true
		g.e.sentMu.Unlock()
	}
	ag.CAs = g.saidCAs(ctx, ag, c, hello)
	if err := g.e.Connected(ctx, ag, hello.AgentVersion); err != nil {
		if ok && os {
			g.e.sentMu.Lock()
			delete(g.e.osConns, c.id)
			g.e.sentMu.Unlock()
		}
		return err
	}
	return nil
}

// saidCAs is what the agent says of its CAs as it connects (its hello's fingerprints, and the
// CA that issued the certificate of connection c), which the write recording its connection
// records with its row: bcd ca activate and finish read it. What is out of bounds
// (store.AgentCAs.Check: any agent says it, a lessee's OS too) is not recorded (nil): the agent
// is listed as never having said, which holds a rotation's stage back, and the connection goes
// on.
func (g *Gateway) saidCAs(ctx context.Context, ag Agent, c conn, hello gateway.Hello) *store.AgentCAs {
	cas := store.AgentCAs{Trusted: hello.CAs, Issuer: c.issuer}
	if cas.Issuer == "" && g.e.ca != nil && len(c.cert) > 0 {
		// (The handshake's chain says it without checking the signature a second time.)
		cas.Issuer = g.e.ca.IssuerOf(c.cert)
	}
	if err := cas.Check(); err != nil {
		if g.e.log != nil {
			g.e.log.LogAttrs(ctx, slog.LevelWarn, "not recording the CAs an agent says it trusts", slog.String("agent", ag.ID), slog.Any("error", err))
		}
		return nil
	}
	return &cas
}

// Watermark is the store's watermark for the agents' heartbeat answers (Engine.Watermark).
func (g *Gateway) Watermark() (gateway.Watermark, bool) {
	w, ok := g.e.Watermark()
	return gateway.Watermark{StoreID: w.StoreID, Fences: w.Fences, Beats: w.Beats}, ok
}

func (g *Gateway) Disconnected(ctx context.Context, a gateway.AgentRef) error {
	ag := g.agent(ctx, a)
	g.e.sentMu.Lock()
	delete(g.e.osConns, ag.ConnID)
	g.e.sentMu.Unlock()
	return g.e.Disconnected(ctx, ag)
}

func (g *Gateway) Status(ctx context.Context, a gateway.AgentRef, s gateway.Status) error {
	ag := g.agent(ctx, a)
	if ag.Kind == "site" && len(s.Withheld) > 0 {
		if err := g.e.RecordWithheld(ctx, ag, s.Withheld); err != nil {
			return err
		}
	}
	if mode, ok := s.Facts["dhcp"]; ag.Kind == "site" && ok {
		if err := g.e.RecordBootServices(ctx, ag, mode, s.Facts["bootBinding"]); err != nil {
			return err
		}
	}
	if ag.Kind == "site" {
		if err := g.e.RecordArtifactCache(ctx, ag, s.Facts); err != nil {
			return err
		}
	}
	if ag.Kind != "site" || len(s.Discovered) == 0 {
		return g.e.Seen(ctx, ag)
	}
	ds := make([]Discovery, 0, len(s.Discovered))
	for _, d := range s.Discovered {
		ds = append(ds, Discovery{MAC: d.MAC, UUID: d.UUID, Arch: d.Arch, FirstSeen: d.FirstSeen, LastSeen: d.LastSeen, Inventory: d.Inventory})
	}
	return g.e.RecordDiscovered(ctx, ag, ds)
}

// ---------------------------------------------------------------- identities

func (g *Gateway) JoinSite(ctx context.Context, token string, csrDER []byte) ([]byte, error) {
	cert, err := g.e.JoinSite(ctx, token, csrDER)
	if errors.Is(err, store.ErrTokenInvalid) {
		return nil, gateway.ErrTokenRefused
	}
	return cert, err
}

// JoinNode takes a ramdisk's discovery token or an installed OS's instance token (told apart by
// their prefixes).
func (g *Gateway) JoinNode(ctx context.Context, token string, csrDER []byte, hints gateway.NodeHints) ([]byte, error) {
	kind := "node"
	if strings.HasPrefix(token, pki.InstanceTokenPrefix) {
		kind = "os"
	}
	cert, _, _, err := g.e.JoinNode(ctx, token, csrDER, kind)
	if errors.Is(err, store.ErrTokenInvalid) {
		return nil, gateway.ErrTokenRefused
	}
	return cert, err
}

// Renew implements gateway.Identities (RenewCertificate; the identity is the certificate's).
func (g *Gateway) Renew(ctx context.Context, _ pki.Identity, certDER []byte) ([]byte, error) {
	return g.e.RenewCertificate(ctx, certDER)
}

// SiteAgentRevoked implements gateway.Identities.
func (g *Gateway) SiteAgentRevoked(ctx context.Context, agentID string) (bool, error) {
	return g.e.st.SiteAgentRevoked(ctx, agentID)
}

func (g *Gateway) CurrentGeneration(ctx context.Context, nodeID string) (uint64, error) {
	gen, err := g.e.CurrentGeneration(ctx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return 0, gateway.ErrNotFound
	}
	return gen, err
}

// AttachConsole implements gateway.Consoles: site agent a runs command id, a bmc.console
// assigned to it and not ended, and attaches to the operator's session it serves (open on
// this server).
func (g *Gateway) AttachConsole(ctx context.Context, a gateway.AgentRef, id string) (gateway.ConsoleEnd, error) {
	hub := g.e.consoles
	if hub == nil {
		return nil, gateway.ErrNoConsole
	}
	c, err := g.e.st.Command(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && c.Kind != "bmc.console" {
		return nil, gateway.ErrNoConsole
	}
	if err != nil {
		return nil, fmt.Errorf("reading console command %s: %w", id, err)
	}
	if a.Kind != pki.KindSiteAgent || c.TargetAgent != a.AgentID {
		return nil, gateway.ErrNotYourConsole
	}
	if command.State(c.State).Final() {
		return nil, fmt.Errorf("%w (the command is %s)", gateway.ErrNoConsole, c.State)
	}
	end, err := hub.Attach(ctx, id, a.AgentID)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", gateway.ErrNoConsole, err)
	}
	return end, nil
}

// withdrawOrphanConsoles fails the console commands no agent took whose session's server is
// gone (it stopped without closing them, or died): no other server offers them
// (relaysConsole), so nothing else would end them.
func (e *Engine) withdrawOrphanConsoles(ctx context.Context, tx *store.Tx) error {
	queued, err := tx.QueuedConsoles(ctx)
	if err != nil || len(queued) == 0 {
		return err
	}
	alive, err := tx.ServersAliveSince(ctx, tx.At()-e.cfg.PeerTimeout.Microseconds())
	if err != nil {
		return err
	}
	for _, c := range queued {
		server := consoleServer(c)
		if server == "" || server == e.owner || slices.Contains(alive, server) {
			continue
		}
		if _, _, err := tx.WithdrawCommand(ctx, c.ID, "withdrawn: the server that held its console session ("+server+") is gone"); err != nil {
			return err
		}
	}
	return nil
}

// consoleServer is the server a console command's session is held by ("": any). Pure.
func consoleServer(c store.Command) string {
	var args struct {
		Server string `json:"server"`
	}
	if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
		return ""
	}
	return args.Server
}

// relaysConsole says whether this server's agents may take c: a bmc.console command goes only
// to an agent connected to the server that holds its session (its console stream must reach
// that server's hub); every other command, to any.
func (e *Engine) relaysConsole(c store.Command) bool {
	if c.Kind != "bmc.console" {
		return true
	}
	server := consoleServer(c)
	return server == "" || server == e.owner
}
