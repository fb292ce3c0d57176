package sim

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/engine"
	"bcd/internal/pki"
	"bcd/internal/store"
)

// GatewayTarget is the agent gateway the simulated agents dial.
type GatewayTarget struct {
	URL   string
	CAPEM []byte
	// Dial makes the agents' connections to the gateway; nil dials TCP to URL (agentlink.Config).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DataDir holds each installed OS's identity (a directory per node), which survives its
	// reboots and is lost when its disk is wiped.
	DataDir string
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// GatewayAgent is the simulated site agent running over the gateway, through its lives.
type GatewayAgent struct {
	done chan struct{}
	err  error
}

// Wait blocks until the agent's context ended and its last life stopped; it returns the first
// error that stopped it otherwise (a refused certificate, a journal that failed).
func (g *GatewayAgent) Wait() error {
	<-g.done
	return g.err
}

// gatewayLife is one life of an agent over the gateway: its link, and the deaths chosen for the
// commands it received (mortality decides as each frame arrives).
type gatewayLife struct {
	link  atomic.Pointer[agentlink.Link]
	fates sync.Map // command id → death
	mort  *mortality
}

// received decides, as a frame arrives and before the link records it, whether the agent dies
// holding one of its commands; a death on receipt ends the life there.
func (s *Sim) received(life context.Context, g *gatewayLife) func(*agentlink.Link, []agentlink.Command) {
	return func(l *agentlink.Link, cmds []agentlink.Command) {
		g.link.Store(l)
		for _, c := range cmds {
			switch d := g.mort.fate(store.Command{ID: c.ID, Kind: c.Kind, Args: string(c.Args)}); d {
			case diesOnClaim:
				s.died(life, g.mort)
				return
			case diesBefore, diesAfter:
				g.fates.Store(c.ID, d)
			}
		}
	}
}

// fateOf is the death chosen for command id when it arrived.
func (g *gatewayLife) fateOf(id string) death {
	d, _ := g.fates.LoadAndDelete(id)
	f, _ := d.(death)
	return f
}

// handler runs commands with run for as long as life lasts: the agent dies before or after a
// command as the fate chosen for it on arrival says, and once dead it runs nothing more.
func (s *Sim) handler(life context.Context, g *gatewayLife, run func(ctx context.Context, cmd agentlink.Command) ([]byte, error)) agentlink.Handler {
	return agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		d := g.fateOf(cmd.ID)
		if d == diesBefore {
			s.died(life, g.mort)
		}
		if life.Err() != nil {
			return nil, context.Cause(life) // dead: nothing more runs
		}
		result, err := run(ctx, cmd)
		if d == diesAfter {
			s.died(life, g.mort)
		}
		return result, err
	})
}

// crash kills the life's link (agentlink.Link.Crash): nothing more is sent or journaled.
func (g *gatewayLife) crash() {
	if l := g.link.Load(); l != nil {
		l.Crash()
	}
}

// RunSiteAgentOverGateway runs the simulated site agent as a real agent: it joins with the
// bootstrap token, keeps its identity and journal in dataDir, and serves commands over the
// gateway stream. BMC commands must carry credentials encrypted to it, which it decrypts and
// checks. When it dies (Faults.SiteAgentDeath, DieOnClaim, DieBefore, DieAfter) it is killed
// (agentlink.Link.Crash) and restarts at once from dataDir, as `bcd site` under its service
// manager does: it reports the commands it had started and not finished as interrupted, never
// run again, and asks about those it had not started.
func (s *Sim) RunSiteAgentOverGateway(ctx context.Context, joinToken, dataDir string) (*GatewayAgent, error) {
	// The agent's key is made here, so that every life decrypts with it (a restart loads the
	// same key from dataDir).
	key, _, err := pki.NewKeyAndCSR("sim-site")
	if err != nil {
		return nil, err
	}
	// Machines powered on by a command outlive the command and the agent: they run under ctx.
	machines := ctx
	cfg := agentlink.Config{GatewayURL: s.cfg.Gateway.URL, CAPEM: s.cfg.Gateway.CAPEM, Dial: s.cfg.Gateway.Dial, DataDir: dataDir,
		Kind: agentlink.KindSite, JoinToken: joinToken, Key: key, Logger: quiet(), AgentVersion: "sim-site"}
	dial := func() (*agentlink.Link, error) {
		life, die := context.WithCancel(ctx)
		g := &gatewayLife{}
		g.mort = &mortality{fate: s.siteDeath, deaths: &s.deaths, die: func() { g.crash(); die() }}
		cfg.Received = s.received(life, g)
		h := s.handler(life, g, func(_ context.Context, cmd agentlink.Command) ([]byte, error) {
			s.counted(cmd.ID)
			return s.siteOverGateway(machines, key, cmd)
		})
		link, err := agentlink.Dial(life, cfg, h)
		if err != nil {
			die()
			return nil, err
		}
		g.link.Store(link)
		s.mu.Lock()
		s.siteStatus = func(ds []agentlink.Discovered) { link.SetStatus(agentlink.Status{Discovered: ds}) }
		s.mu.Unlock()
		return link, nil
	}
	link, err := dial()
	if err != nil {
		return nil, err
	}
	cfg.JoinToken = "" // joined: later lives use the identity in dataDir
	ga := &GatewayAgent{done: make(chan struct{})}
	go func() {
		defer close(ga.done)
		for {
			err := link.Wait()
			if !errors.Is(err, agentlink.ErrCrashed) || ctx.Err() != nil {
				ga.err = err
				return
			}
			if link, err = dial(); err != nil {
				if ctx.Err() == nil {
					ga.err = fmt.Errorf("restarting the site agent after its death: %w", err)
					s.fail(ga.err)
				}
				return
			}
		}
	}()
	return ga, nil
}

// siteOverGateway runs a site command received over the gateway: BMC commands must carry
// credentials encrypted to the agent's key.
func (s *Sim) siteOverGateway(machines context.Context, key crypto.Signer, cmd agentlink.Command) ([]byte, error) {
	if len(cmd.Kind) > 4 && cmd.Kind[:4] == "bmc." {
		var args struct{ Credentials string }
		if err := json.Unmarshal(cmd.Args, &args); err != nil || args.Credentials == "" {
			return nil, errors.New("BMC command without credentials")
		}
		plain, err := pki.DecryptAsAgent(key, args.Credentials)
		if err != nil {
			return nil, fmt.Errorf("decrypting BMC credentials: %w", err)
		}
		var cred struct{ Username, Password string }
		if json.Unmarshal(plain, &cred) != nil || cred.Username == "" || cred.Password == "" {
			return nil, errors.New("BMC credentials are empty")
		}
		if cmd.Kind == "bmc.rotate" {
			var rot struct{ NewCredentials string }
			if err := json.Unmarshal(cmd.Args, &rot); err != nil || rot.NewCredentials == "" {
				return nil, errors.New("bmc.rotate without the new credential")
			}
			plain, err := pki.DecryptAsAgent(key, rot.NewCredentials)
			if err != nil {
				return nil, fmt.Errorf("decrypting the new BMC credential: %w", err)
			}
			var next struct{ Username, Password string }
			if json.Unmarshal(plain, &next) != nil || next.Username != cred.Username || next.Password == "" || next.Password == cred.Password {
				return nil, errors.New("the new BMC credential is empty or unchanged")
			}
		}
	}
	u := s.siteCommand(machines, engine.Agent{}, store.Command{ID: cmd.ID, Kind: cmd.Kind, NodeID: cmd.NodeID, Args: string(cmd.Args)})
	if u.State != "succeeded" {
		return nil, errors.New(u.Error)
	}
	return u.Result, nil
}

// ramdiskOverGateway runs a boot of m's ramdisk as a real agent. When it dies
// (Faults.RamdiskDeath, DieOnClaim, DieBefore, DieAfter) its link is killed and the machine
// stays on, hung: only a new boot brings a ramdisk back.
func (s *Sim) ramdiskOverGateway(ctx context.Context, m *Machine, token string) {
	boot := ctx // this boot of the ramdisk; a command's context ends with the command
	g := &gatewayLife{}
	g.mort = &mortality{fate: s.ramdiskDeath, deaths: &s.ramdiskDeaths, die: func() { g.crash(); m.CrashRamdisk() }}
	h := s.handler(boot, g, func(ctx context.Context, cmd agentlink.Command) ([]byte, error) {
		return s.ramdiskCommand(ctx, boot, m, cmd)
	})
	// A key made ahead, if any is left (Sim.MakeKeys): the link makes its request with it.
	var key crypto.Signer
	if k, _, ok := s.keys.take(); ok {
		key = k
	}
	link, err := dialRetrying(ctx, agentlink.Config{GatewayURL: s.cfg.Gateway.URL, CAPEM: s.cfg.Gateway.CAPEM, Dial: s.cfg.Gateway.Dial, Kind: agentlink.KindNode,
		Key: key, DiscoveryToken: token, Hints: agentlink.NodeHints{ProductUUID: m.UUID, MACs: m.MACs}, Logger: quiet(), AgentVersion: "sim-ramdisk",
		Received: s.received(boot, g)}, h)
	if err != nil {
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("ramdisk of %s dialing the gateway: %w", m.NodeID, err))
		}
		return
	}
	g.link.Store(link)
	<-ctx.Done()
	link.Wait()
}

// ramdiskCommand runs one command of m's ramdisk received over the gateway (boot is the
// ramdisk's life).
func (s *Sim) ramdiskCommand(ctx, boot context.Context, m *Machine, cmd agentlink.Command) ([]byte, error) {
	s.counted(cmd.ID)
	s.sleep(ctx)
	if cmd.Kind == "boot.kexec" && s.faults().KexecFail {
		return nil, errors.New("kexec_file_load: operation not permitted")
	}
	if cmd.Kind == "boot.kexec" {
		s.kexec(ctx, m) // the ramdisk ends here: no result is ever reported
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if cmd.Kind == "ramdisk.powerOff" {
		// As the real ramdisk: the result reaches the gateway, then the host goes down.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			t := time.NewTimer(100 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				s.selfPowerOff(m)
			case <-boot.Done():
			}
		}()
		return json.Marshal(map[string]any{"poweringOff": true})
	}
	result, _, err := s.ramdiskWork(m, cmd.Kind)
	if err != nil {
		return nil, err
	}
	return json.Marshal(result) // agentlink signs attested kinds with the node key
}

func (s *Sim) osOverGateway(ctx context.Context, m *Machine, token string) {
	s.sleep(ctx)
	h := agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		return nil, fmt.Errorf("an installed OS runs no %s", cmd.Kind)
	})
	dir := filepath.Join(s.cfg.Gateway.DataDir, m.NodeID)
	m.mu.Lock()
	rejoin := m.osGeneration != 0 && token != "" && token != m.osToken
	m.osToken = token
	m.mu.Unlock()
	if rejoin {
		// A newer instance token: the kept certificate's generation was revoked (rescue), and
		// the gateway refuses it; the OS joins again with the token its metadata serves.
		if err := os.RemoveAll(dir); err != nil {
			s.fail(fmt.Errorf("OS of %s forgetting its refused identity: %w", m.NodeID, err))
			return
		}
	}
	linkCtx, cancel := context.WithCancel(ctx)
	link, err := dialRetrying(linkCtx, agentlink.Config{GatewayURL: s.cfg.Gateway.URL, CAPEM: s.cfg.Gateway.CAPEM, Dial: s.cfg.Gateway.Dial, Kind: agentlink.KindNode,
		DataDir: dir, DiscoveryToken: token, Capabilities: []string{engine.RoleOS}, Logger: quiet(), AgentVersion: "sim-os"}, h)
	if err != nil {
		cancel()
		// Reported unless the simulation is ending (ctx, not linkCtx: cancel ended that).
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("OS of %s dialing the gateway: %w", m.NodeID, err))
		}
		return
	}
	m.mu.Lock()
	m.osUp, m.osGeneration = true, 1
	m.osLink = func() { cancel(); link.Wait() }
	m.mu.Unlock()
}

// dialRetrying joins and connects like a booted machine does: while the control plane is
// unreachable it tries again (a refused token is final).
func dialRetrying(ctx context.Context, cfg agentlink.Config, h agentlink.Handler) (*agentlink.Link, error) {
	if cfg.Key == nil && cfg.DataDir == "" {
		key, _, err := pki.NewKeyAndCSR("sim")
		if err != nil {
			return nil, err
		}
		cfg.Key = key // the same key for every join attempt
	}
	wait := 100 * time.Millisecond
	deadline := time.Now().Add(2 * time.Minute)
	for {
		link, err := agentlink.Dial(ctx, cfg, h)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || errors.Is(err, agentlink.ErrRefused) {
			return link, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}
