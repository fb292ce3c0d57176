package osjoin

import (
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/engine"
	"bcd/internal/pki"
)

// LinkConfig is the agentlink configuration of an installed OS joining with md: kind node, the
// instance token, the capability engine.RoleOS (its connection completes await.rejoin steps).
func LinkConfig(md Metadata, key crypto.Signer, dataDir string, log *slog.Logger) agentlink.Config {
	return agentlink.Config{
		GatewayURL:     md.Gateway,
		CAPEM:          []byte(md.CA),
		Kind:           agentlink.KindNode,
		DiscoveryToken: md.InstanceToken,
		Key:            key,
		DataDir:        dataDir,
		Logger:         log,
		Capabilities:   []string{engine.RoleOS},
	}
}

// Errors of Joiner.Join.
var (
	// ErrSpent: the gateway refused the instance token (used by another key, expired, or
	// unknown): only preparing the instance again (a new token) can help.
	ErrSpent = errors.New("the gateway refused the instance token (used or expired): the control plane must prepare the instance again")
	// ErrUnreachable: the gateway could not be reached, or did not keep the stream up long
	// enough to have recorded it; trying again later can help.
	ErrUnreachable = errors.New("the gateway is unreachable now")
)

// JoinerConfig tunes a Joiner. Zero values take the defaults.
type JoinerConfig struct {
	Logger *slog.Logger
	// Heartbeat is the link's heartbeat interval while held; default 250 ms. The stream is
	// proven recorded once it outlived ProofBeats of them (see Join).
	Heartbeat time.Duration
	// Linger keeps the proven connection up a while longer before closing it (the engine
	// normally completes the await.rejoin step in the transaction that records the connection;
	// when that fails the reconciler does it soon after, reading a connection still up);
	// default 2 s.
	Linger time.Duration
	// Timeout bounds one Join (joining, and the stream's proof); default 15 s, well within the
	// site agent's 30 s write deadline.
	Timeout time.Duration
	// Remember bounds the instance tokens whose state (key, done) is kept; default 4096.
	Remember int
	// Link adjusts the agentlink configuration before dialing (tests).
	Link func(*agentlink.Config)
}

// ProofBeats: an agent stream that has received nothing for 3 heartbeat intervals is ended by
// the agent at its next heartbeat tick (agentlink's silence check), and the gateway sends
// nothing on a stream before it has recorded the connection (gateway stream.go: control frames
// go out only after Queue.Connected returned). A stream still up one tick past 4 intervals
// has therefore been answered, so recorded.
const ProofBeats = 5

// Joiner joins the gateway as the installed OS of a node on the OS's behalf (the site agent's
// POST /rejoin for images that run no bcd): a throwaway key, the instance token, kind node with
// engine.RoleOS; it holds the stream until the control plane has recorded it, then closes it.
//
// Per instance token (kept by its SHA-256, never the token) it remembers the key of its join
// (a join whose answer was lost is retried with the same key, which the control plane accepts
// again) and whether a join succeeded: a second Join for a token it already used successfully
// does nothing (the token is spent by that join). Joins of one token are serialized. Safe for
// concurrent use.
type Joiner struct {
	cfg JoinerConfig

	mu     sync.Mutex
	tokens map[[32]byte]*tokenState
}

type tokenState struct {
	mu   sync.Mutex // held for a whole Join of this token
	key  crypto.Signer
	done bool
}

// NewJoiner builds a Joiner.
func NewJoiner(cfg JoinerConfig) *Joiner {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 250 * time.Millisecond
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 2 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 15 * time.Second
	}
	if cfg.Remember <= 0 {
		cfg.Remember = 4096
	}
	return &Joiner{cfg: cfg, tokens: map[[32]byte]*tokenState{}}
}

func (j *Joiner) state(token string) *tokenState {
	h := sha256.Sum256([]byte(token))
	j.mu.Lock()
	defer j.mu.Unlock()
	st, ok := j.tokens[h]
	if !ok {
		if len(j.tokens) >= j.cfg.Remember {
			for k, s := range j.tokens { // drop an arbitrary idle one: a bound, not a cache policy
				if s.mu.TryLock() {
					delete(j.tokens, k)
					s.mu.Unlock()
					break
				}
			}
		}
		st = &tokenState{}
		j.tokens[h] = st
	}
	return st
}

// Join joins as md's node and holds the stream until it is proven recorded (ProofBeats
// heartbeats), plus Linger; nil also when this Joiner already joined with md's token. Errors
// wrap ErrSpent (answer 401) or ErrUnreachable (answer 503), and never carry the token.
func (j *Joiner) Join(ctx context.Context, md Metadata) error {
	st := j.state(md.InstanceToken)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return nil
	}
	if st.key == nil {
		key, _, err := pki.NewKeyAndCSR("bcd os rejoin")
		if err != nil {
			return fmt.Errorf("generating the join key: %w", err)
		}
		st.key = key
	}
	ctx, cancel := context.WithTimeout(ctx, j.cfg.Timeout)
	defer cancel()
	lc := LinkConfig(md, st.key, "", j.cfg.Logger)
	lc.AgentVersion = "bcd-site-rejoin"
	lc.HeartbeatInterval = j.cfg.Heartbeat
	lc.MinBackoff, lc.MaxBackoff = j.cfg.Heartbeat/5, j.cfg.Heartbeat/5
	if j.cfg.Link != nil {
		j.cfg.Link(&lc)
	}
	link, err := agentlink.Dial(ctx, lc, refuseAll())
	if err != nil {
		if errors.Is(err, agentlink.ErrRefused) {
			return fmt.Errorf("joining as node %s: %w", md.NodeID, ErrSpent)
		}
		return fmt.Errorf("joining as node %s: %w (%w)", md.NodeID, ErrUnreachable, err)
	}
	err = j.hold(ctx, link)
	cancel()
	_ = link.Wait()
	if err != nil {
		return fmt.Errorf("holding the stream of node %s: %w", md.NodeID, err)
	}
	st.done = true
	j.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "rejoined the gateway on behalf of a node's installed OS", slog.String("node", md.NodeID))
	return nil
}

// hold waits until one stream of link has stayed up for ProofBeats heartbeats, then Linger.
func (j *Joiner) hold(ctx context.Context, link *agentlink.Link) error {
	proof := time.Duration(ProofBeats) * j.cfg.Heartbeat
	done := make(chan struct{})
	go func() {
		_ = link.Wait()
		close(done)
	}()
	tick := time.NewTicker(j.cfg.Heartbeat / 5)
	defer tick.Stop()
	seen, since := link.Sessions(), time.Now()
	var proven time.Time
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: no stream stayed up for %s (%v)", ErrUnreachable, proof, context.Cause(ctx))
		case <-done:
			if err := link.Wait(); errors.Is(err, agentlink.ErrRefused) {
				return fmt.Errorf("the gateway refused the certificate it had just issued: %w", ErrSpent)
			}
			return fmt.Errorf("%w: the link stopped", ErrUnreachable)
		case now := <-tick.C:
			if n := link.Sessions(); n != seen {
				seen, since, proven = n, now, time.Time{} // a new stream: the last one ended
				continue
			}
			switch {
			case seen == 0:
			case proven.IsZero() && now.Sub(since) >= proof:
				proven = now
			case !proven.IsZero() && now.Sub(proven) >= j.cfg.Linger:
				return nil
			}
		}
	}
}

// refuseAll is the command handler: an installed OS runs nothing the control plane sends.
func refuseAll() agentlink.Handler {
	return agentlink.HandlerFunc(func(_ context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		return nil, fmt.Errorf("an installed OS runs no commands (%s refused)", cmd.Kind)
	})
}
