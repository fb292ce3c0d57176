package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
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
	// DataDir holds each installed OS's identity (a directory per node), which survives its
	// reboots and is lost when its disk is wiped.
	DataDir string
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// RunSiteAgentOverGateway runs the simulated site agent as a real agent: it joins with the
// bootstrap token, keeps its identity in dataDir, and serves commands over the gateway stream.
// BMC commands must carry credentials encrypted to it, which it decrypts and checks.
func (s *Sim) RunSiteAgentOverGateway(ctx context.Context, joinToken, dataDir string) (*agentlink.Link, error) {
	var link *agentlink.Link
	// Machines powered on by a command outlive the command: they run under the agent's context.
	machines := ctx
	h := agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		s.counted(cmd.ID)
		if len(cmd.Kind) > 4 && cmd.Kind[:4] == "bmc." {
			var args struct{ Credentials string }
			if err := json.Unmarshal(cmd.Args, &args); err != nil || args.Credentials == "" {
				return nil, errors.New("BMC command without credentials")
			}
			plain, err := pki.DecryptAsAgent(link.Key(), args.Credentials)
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
				plain, err := pki.DecryptAsAgent(link.Key(), rot.NewCredentials)
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
	})
	var err error
	link, err = agentlink.Dial(ctx, agentlink.Config{GatewayURL: s.cfg.Gateway.URL, CAPEM: s.cfg.Gateway.CAPEM, DataDir: dataDir,
		Kind: agentlink.KindSite, JoinToken: joinToken, Logger: quiet(), AgentVersion: "sim-site"}, h)
	if err == nil {
		s.mu.Lock()
		s.siteStatus = func(ds []agentlink.Discovered) { link.SetStatus(agentlink.Status{Discovered: ds}) }
		s.mu.Unlock()
	}
	return link, err
}

func (s *Sim) ramdiskOverGateway(ctx context.Context, m *Machine, token string) {
	boot := ctx // this boot of the ramdisk; a command's context ends with the command
	h := agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
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
	})
	link, err := dialRetrying(ctx, agentlink.Config{GatewayURL: s.cfg.Gateway.URL, CAPEM: s.cfg.Gateway.CAPEM, Kind: agentlink.KindNode,
		DiscoveryToken: token, Hints: agentlink.NodeHints{ProductUUID: m.UUID, MACs: m.MACs}, Logger: quiet(), AgentVersion: "sim-ramdisk"}, h)
	if err != nil {
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("ramdisk of %s dialing the gateway: %w", m.NodeID, err))
		}
		return
	}
	<-ctx.Done()
	link.Wait()
}

func (s *Sim) osOverGateway(ctx context.Context, m *Machine, token string) {
	s.sleep(ctx)
	h := agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		return nil, fmt.Errorf("an installed OS runs no %s", cmd.Kind)
	})
	dir := filepath.Join(s.cfg.Gateway.DataDir, m.NodeID)
	ctx, cancel := context.WithCancel(ctx)
	link, err := dialRetrying(ctx, agentlink.Config{GatewayURL: s.cfg.Gateway.URL, CAPEM: s.cfg.Gateway.CAPEM, Kind: agentlink.KindNode,
		DataDir: dir, DiscoveryToken: token, Capabilities: []string{engine.RoleOS}, Logger: quiet(), AgentVersion: "sim-os"}, h)
	if err != nil {
		cancel()
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
