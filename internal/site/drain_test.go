package site_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/site"
)

// slowBMC is a BMC driver whose power actions run until released.
type slowBMC struct {
	started chan<- string
	release <-chan struct{}
	mu      *sync.Mutex
	sets    map[string]int // by address
	addr    string
}

func (b slowBMC) SetPower(ctx context.Context, _ bmc.PowerAction) error {
	b.mu.Lock()
	b.sets[b.addr]++
	b.mu.Unlock()
	b.started <- b.addr
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (slowBMC) GetPower(context.Context) (bmc.PowerState, error) { return bmc.PowerOff, nil }

// TestStopDrainsHeldCommands stops a site agent (as SIGTERM does) while a power action runs:
// the agent lets it finish and report before it exits, and leaves a command offered meanwhile
// unacknowledged, for another agent, never run.
func TestStopDrainsHeldCommands(t *testing.T) {
	env := startGateway(t)
	cfg := agentConfig(t, env, "a1", t.TempDir(), logger(t, &syncBuffer{}))
	started, release := make(chan string, 2), make(chan struct{})
	var mu sync.Mutex
	sets := map[string]int{}
	cfg.Drivers = map[string]site.DriverFactory{"slow": func(_ context.Context, ep bmc.Endpoint) (any, error) {
		return slowBMC{started: started, release: release, mu: &mu, sets: sets, addr: ep.Address}, nil
	}}
	cfg.NoPowerPolling = true
	ag := startAgent(t, cfg, "a1")
	creds := credentials(t, ag.certDER(t), bmcUser, bmcPass)
	power := func(id, addr string) gateway.Command {
		b, _ := json.Marshal(map[string]any{"nodeId": id, "action": "off", "credentials": creds,
			"bmc": map[string]any{"driver": "slow", "address": addr, "usernameRef": "secret://u", "passwordRef": "secret://p"}})
		return gateway.Command{ID: id, Kind: site.KindBMCPower, NodeID: id, Args: b, Deadline: time.Now().Add(time.Minute)}
	}
	env.Queue.Enqueue(ag.ref, power("off-1", "https://10.9.0.1"))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("off-1 never reached the BMC")
	}
	ag.cancel() // the stop signal
	env.Queue.Enqueue(ag.ref, power("off-2", "https://10.9.0.2"))
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if e, _ := env.Queue.Get("off-2"); e.Claims > 0 {
			break // offered to the draining agent
		}
	}
	select {
	case err := <-ag.done:
		t.Fatalf("the agent exited with off-1 running: %v", err)
	default:
	}
	close(release)
	select {
	case err := <-ag.done:
		if err != nil {
			t.Fatalf("agent: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop once off-1 finished")
	}
	if e, _ := env.Queue.Get("off-1"); e.State != gatewaytest.Succeeded {
		t.Errorf("off-1: %s %q, want its result reported before the agent exited", e.State, e.Final.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if e, _ := env.Queue.Get("off-2"); e.Acks != 0 || sets["https://10.9.0.2"] != 0 {
		t.Errorf("off-2: %d acks, %d power actions; want it left for another agent", e.Acks, sets["https://10.9.0.2"])
	}
}
