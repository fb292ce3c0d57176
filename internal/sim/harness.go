package sim

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"bcd/internal/auth"
	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/secrets"
	"bcd/internal/store"
)

// Harness is a control plane (store, node service, engine) with a simulated site.
type Harness struct {
	Store  *store.Store
	Metal  *metal.Service
	Engine *engine.Engine
	Sim    *Sim
	Admin  auth.Principal
	SiteID string
	// CA is the engines' CA (Start only).
	CA *pki.CA
	// engines are the servers sharing the store (Engine is the first); nil for a harness on a
	// server elsewhere (StartRemote).
	engines spread
	// stores are the engines' stores (StartReplicas); nil: Store alone.
	stores []*store.Store
	// ctl drives a server elsewhere (StartRemote); nil: this harness's own service and store.
	ctl Control
	// serverPeak is the highest server RSS sampled (StartRemote).
	serverPeak float64
	// salt is the second byte of the MACs Enroll makes and a part of their product UUIDs
	// (0: 0x5a); runs against one server differ in it.
	salt   byte
	cancel context.CancelFunc
	done   chan struct{}
}

// StartOnServer builds a harness whose simulated agents use the real agent gateway of srv
// (mTLS, join tokens, agentlink): a site agent joined with a bootstrap token, ramdisks joined
// with their boot entries' tokens. The caller runs srv.Serve. The agents dial with
// cfg.Gateway's Dial when there is one (srv's in-memory network); the rest of the target is
// srv's.
func StartOnServer(ctx context.Context, srv ServerSide, cfg Config, dataDir string) (*Harness, error) {
	st := srv.Service().Store()
	site, err := st.Site(ctx, "default")
	if err != nil {
		return nil, err
	}
	cfg.SiteID = site.ID
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	if cfg.Gateway != nil {
		dial = cfg.Gateway.Dial
	}
	cfg.Gateway = &GatewayTarget{URL: srv.GatewayURL(), CAPEM: srv.CAPEM(), DataDir: filepath.Join(dataDir, "os"), Dial: dial}
	h := &Harness{Store: st, Metal: srv.Service(), Engine: srv.Engine(), engines: spread{srv.Engine()}, Sim: New(cfg, srv.Engine()), Admin: auth.Principal{Name: "sim", Role: auth.Admin}, SiteID: site.ID, done: make(chan struct{})}
	if err := SeedImages(ctx, srv.Service(), h.Admin, "img", "debian-12", "sim-image"); err != nil {
		return nil, err
	}
	tok, err := srv.CreateSiteJoinToken(ctx, site.ID, time.Hour)
	if err != nil {
		return nil, err
	}
	if err := h.joinSiteAgent(ctx, tok, dataDir); err != nil {
		return nil, err
	}
	return h, nil
}

// ServerSide is what StartOnServer needs of a running bcd server.
type ServerSide interface {
	Service() *metal.Service
	Engine() *engine.Engine
	GatewayURL() string
	CAPEM() []byte
	CreateSiteJoinToken(ctx context.Context, siteID string, ttl time.Duration) (string, error)
}

// Start builds and starts a harness over st.
func Start(ctx context.Context, st *store.Store, cfg Config, ecfg engine.Config, log *slog.Logger) (*Harness, error) {
	return StartReplicas(ctx, []*store.Store{st}, cfg, ecfg, log)
}

// StartReplicas builds and starts a harness with one engine per store, as that many servers
// sharing one PostgreSQL database (each store a connection pool of its own to it). The agents
// are spread over them as a balancer would (spread); the node service is the first's.
func StartReplicas(ctx context.Context, stores []*store.Store, cfg Config, ecfg engine.Config, log *slog.Logger) (*Harness, error) {
	if len(stores) > 1 && stores[0].Engine() != store.Postgres {
		return nil, fmt.Errorf("%d servers on one %s store: several servers share a PostgreSQL store only", len(stores), stores[0].Engine())
	}
	st := stores[0]
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	sealer, _ := secrets.NewSealer(bytes.Repeat([]byte{3}, secrets.KeySize))
	svc := metal.New(st, sealer, log)
	if _, err := svc.Bootstrap(ctx); err != nil {
		return nil, err
	}
	ca, err := pki.CreateCA("bcd sim CA", time.Now())
	if err != nil {
		return nil, err
	}
	ecfg.AutoEnroll = svc.AutoEnrollInband
	svc.SetApprovalTimeout(ecfg.ApprovalTimeout)
	engines := make(spread, len(stores))
	for i, st := range stores {
		engines[i] = engine.New(st, ca, log, ecfg)
	}
	var link Link = engines[0]
	if len(engines) > 1 {
		link = engines
	}
	site, err := st.Site(ctx, "default")
	if err != nil {
		return nil, err
	}
	cfg.SiteID = site.ID
	h := &Harness{Store: st, stores: stores, Metal: svc, Engine: engines[0], engines: engines, Sim: New(cfg, link), Admin: auth.Principal{Name: "sim", Role: auth.Admin}, SiteID: site.ID, CA: ca, done: make(chan struct{})}
	// A verb that queued a wake-up nudges the reconcilers, as bcd server's does its engine.
	svc.OnWake(h.nudge)
	key, csr, err := pki.NewKeyAndCSR("sim-site-1")
	if err != nil {
		return nil, err
	}
	cert, err := ca.IssueSiteAgent(csr, site.ID, "sim-site-1", 24*time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	h.Sim.SetSiteIdentity(key, cert)
	if err := SeedImages(ctx, svc, h.Admin, "img", "debian-12", "sim-image"); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	h.cancel = cancel
	go func() {
		defer close(h.done)
		var wg sync.WaitGroup
		// The site agent is waited for too: its last act, its departure, is a write that
		// must not outlive Stop (and the store a test closes after it).
		wg.Go(func() { h.Sim.RunSiteAgent(rctx, "sim-site-1") })
		for _, e := range engines {
			wg.Go(func() { e.Run(rctx) })
		}
		wg.Wait()
	}()
	return h, nil
}

// nudge asks every engine of the harness to look for due work now.
func (h *Harness) nudge() {
	for _, e := range h.engines {
		e.Nudge()
	}
}

// spread is a Link over several servers sharing one store, as a balancer in front of them
// spreads agents: a site agent on the first, each node's agents on one chosen by the node.
type spread []*engine.Engine

func (s spread) of(a engine.Agent) *engine.Engine {
	if a.NodeID == "" {
		return s[0]
	}
	h := fnv.New32a()
	h.Write([]byte(a.NodeID))
	return s[h.Sum32()%uint32(len(s))]
}

func (s spread) Claim(ctx context.Context, a engine.Agent, limit int) ([]store.Command, error) {
	return s.of(a).Claim(ctx, a, limit)
}

func (s spread) AckAll(ctx context.Context, a engine.Agent, ids []string) (map[string]error, error) {
	return s.of(a).AckAll(ctx, a, ids)
}

func (s spread) Report(ctx context.Context, a engine.Agent, u engine.Update) error {
	return s.of(a).Report(ctx, a, u)
}

func (s spread) Connected(ctx context.Context, a engine.Agent, version string) error {
	return s.of(a).Connected(ctx, a, version)
}

func (s spread) Disconnected(ctx context.Context, a engine.Agent) error {
	return s.of(a).Disconnected(ctx, a)
}

// JoinNode goes to the first server: the joining agent is not known yet (its token names it).
func (s spread) JoinNode(ctx context.Context, token string, csrDER []byte, kind string) ([]byte, string, uint64, error) {
	return s[0].JoinNode(ctx, token, csrDER, kind)
}

func (s spread) Subscribe(a engine.Agent) (<-chan struct{}, func()) { return s.of(a).Subscribe(a) }

// CPUBound is the first server's (cpuBounder): the simulated machines share its gate.
func (s spread) CPUBound(ctx context.Context, f func()) error { return s[0].CPUBound(ctx, f) }

func (s spread) RecordDiscovered(ctx context.Context, a engine.Agent, ds []engine.Discovery) error {
	return s.of(a).RecordDiscovered(ctx, a, ds)
}

// Stop ends the engine and the simulated agents.
func (h *Harness) Stop() {
	h.cancel()
	<-h.done
	h.Sim.Wait()
}

// clients is how many API calls the harness makes at once (enrolments, verbs), as several
// operators' clients or a script's parallel calls would: one call at a time would measure the
// commit latency of a single caller, not the control plane's throughput.
const clients = 32

// each calls f(i) for i in [0, n) from up to clients goroutines and returns the first error.
func each(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	return eachOn(ctx, clients, n, f)
}

// eachOn calls f(i) for i in [0, n) from up to workers goroutines and returns the first error
// (ctx's if it ends first).
func eachOn(ctx context.Context, workers, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// Enroll enrolls n machines named prefix-i and registers them with the simulation.
func (h *Harness) Enroll(ctx context.Context, prefix string, n int) ([]string, error) {
	ids := make([]string, n)
	err := each(ctx, n, func(ctx context.Context, i int) error {
		salt := h.salt
		if salt == 0 {
			salt = 0x5a
		}
		mac := fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", salt, (i>>24)&0xff, (i>>16)&0xff, (i>>8)&0xff, i&0xff)
		uuid := fmt.Sprintf("%08x-00%02x-4000-8000-%012x", i, salt, i)
		id, err := h.control().Enroll(ctx, metal.EnrollInput{Name: fmt.Sprintf("%s-%d", prefix, i), Pool: "default",
			MACs: []string{mac}, ProductUUID: uuid, BMC: metal.BMCInput{Address: "https://10.9.0.1", Username: "admin", Password: "sim-password"}})
		if err != nil {
			return fmt.Errorf("enrolling %s-%d: %w", prefix, i, err)
		}
		h.Sim.Add(&Machine{NodeID: id, UUID: uuid, MACs: []string{mac}})
		ids[i] = id
		return nil
	})
	h.control().Nudge()
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// EnrollByUUID enrolls a machine as IPMI nodes are: by product UUID, with no MAC (its BMC
// reports no NIC). The machine PXE-boots with mac, and iPXE reports pxeUUID ("" : uuid).
func (h *Harness) EnrollByUUID(ctx context.Context, name, pool, uuid, pxeUUID, mac string) (string, error) {
	node, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: name, Pool: pool, ProductUUID: uuid,
		BMC: metal.BMCInput{Address: "https://10.9.0.2", Username: "admin", Password: "sim-password"}})
	if err != nil {
		return "", err
	}
	h.Sim.Add(&Machine{NodeID: node.ID, UUID: uuid, PXEUUID: pxeUUID, MACs: []string{mac}, NoOOBMACs: true})
	h.nudge()
	return node.ID, nil
}

// Apply runs a verb on each node (several calls at once).
func (h *Harness) Apply(ctx context.Context, v provision.Verb, ids []string, in metal.VerbInput) error {
	err := each(ctx, len(ids), func(ctx context.Context, i int) error {
		in := in
		in.Node = ids[i]
		return h.control().Apply(ctx, v, in)
	})
	h.control().Nudge()
	return err
}

// WaitRest waits until every node rests (no target), then returns the states by node.
func (h *Harness) WaitRest(ctx context.Context, ids []string, timeout time.Duration) (map[string]store.Node, error) {
	deadline := time.Now().Add(timeout)
	for {
		out := map[string]store.Node{}
		busy := 0
		for _, id := range ids {
			n, err := h.Store.Node(ctx, id, "")
			if err != nil {
				return nil, err
			}
			out[id] = n
			if n.TargetState != "" && n.State != "failed" {
				busy++
			}
		}
		if busy == 0 {
			return out, nil
		}
		select {
		case err := <-h.Sim.Errors():
			return out, fmt.Errorf("simulated agent: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("%d of %d nodes still busy after %s", busy, len(ids), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
