package agentlink_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/testproc"
)

// TestAgentProcess is the child of TestKilledAgentRunsNothingTwice: a site agent that logs
// every execution durably before it runs it, until it is killed. It does nothing in a normal
// test run.
func TestAgentProcess(t *testing.T) {
	dir := os.Getenv("BCD_AGENT_KILL_DIR")
	if dir == "" {
		t.Skip("child process of TestKilledAgentRunsNothingTwice only")
	}
	execs, err := os.OpenFile(filepath.Join(dir, "executions"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	h := agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		// Logged before it runs: a kill after this line counts as an execution.
		if _, err := execs.WriteString(cmd.ID + "\n"); err != nil {
			return nil, err
		}
		if err := execs.Sync(); err != nil {
			return nil, err
		}
		select { // the work, long enough for kills to land in the middle of it
		case <-time.After(time.Duration(rand.IntN(20)) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return result(cmd.ID), nil
	})
	cfg := agentlink.Config{
		GatewayURL: os.Getenv("BCD_AGENT_KILL_URL"), CAPEM: []byte(os.Getenv("BCD_AGENT_KILL_CA")),
		DataDir: filepath.Join(dir, "agent"), Kind: agentlink.KindSite, JoinToken: os.Getenv("BCD_AGENT_KILL_TOKEN"),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, HeartbeatInterval: time.Second,
		MaxConcurrent: 8, AgentVersion: "test",
	}
	l, err := agentlink.Dial(context.Background(), cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	l.Wait() // until SIGKILL
}

// TestKilledAgentRunsNothingTwice SIGKILLs a site agent process again and again while it runs
// commands, restarting it on its data directory each time: every command ends, and none runs
// twice, whether it was killed on receipt, between its ack and its answer, while running or
// before its result was journaled.
func TestKilledAgentRunsNothingTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts agent processes")
	}
	env := start(t)
	dir := t.TempDir()
	const n = 1000
	cmds := commands("k", n)
	env.Queue.Enqueue(siteRef, cmds...)
	token := env.Identities.SiteToken(siteRef.SiteID, siteRef.AgentID, time.Hour)
	run := func() *testproc.Proc {
		t.Helper()
		p, err := testproc.Start("TestAgentProcess", []string{"BCD_AGENT_KILL_DIR=" + dir, "BCD_AGENT_KILL_URL=" + env.URL,
			"BCD_AGENT_KILL_CA=" + string(env.CA.CertPEM()), "BCD_AGENT_KILL_TOKEN=" + token}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	kills := 0
	life := 50 * time.Millisecond // grows while lives end before the agent got anything done
	deadline := time.Now().Add(3 * time.Minute)
	for env.Queue.Counts().Final < n && time.Now().Before(deadline) {
		before := env.Queue.Counts().Final
		child := run()
		if kills == 0 {
			// The first life joins with the one-time token: not killed before it has (the
			// fake gateway, unlike the control plane, has no retry window for a lost answer).
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = env.Queue.WaitFor(ctx, func(c gatewaytest.Counts) bool { return c.Connected[gatewaytest.AgentKey(siteRef)] > 0 })
			cancel()
		}
		// Let it run a while: long enough to join and work, short enough to die mid-flight.
		ctx, cancel := context.WithTimeout(context.Background(), life+time.Duration(rand.IntN(200))*time.Millisecond)
		_ = env.Queue.WaitFor(ctx, func(c gatewaytest.Counts) bool { return c.Final >= n })
		cancel()
		child.Kill()
		kills++
		if env.Queue.Counts().Final == before {
			life = min(2*life, 2*time.Second) // a loaded machine: the agent needs longer to join
		} else {
			life = max(life/2, 50*time.Millisecond)
		}
	}
	if kills < 3 {
		t.Errorf("the agent was killed only %d times", kills)
	}
	f, err := os.Open(filepath.Join(dir, "executions"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs := map[string]int{}
	for sc := bufio.NewScanner(f); sc.Scan(); {
		runs[sc.Text()]++
	}
	states := map[string]int{}
	for _, c := range cmds {
		e, _ := env.Queue.Get(c.ID)
		states[e.State]++
		switch {
		case runs[c.ID] > 1:
			t.Errorf("%s ran %d times", c.ID, runs[c.ID])
		case e.State == gatewaytest.Succeeded && runs[c.ID] != 1:
			t.Errorf("%s succeeded and ran %d times", c.ID, runs[c.ID])
		case e.State == gatewaytest.Lost && !strings.Contains(e.Final.Error, "interrupted"):
			t.Errorf("%s lost: %q", c.ID, e.Final.Error)
		case e.State != gatewaytest.Succeeded && e.State != gatewaytest.Lost:
			t.Errorf("%s: %s %q, want succeeded, or lost (interrupted by a kill)", c.ID, e.State, e.Final.Error)
		}
	}
	t.Logf("%d kills; %d commands: %v; %d executions", kills, n, states, func() (s int) {
		for _, k := range runs {
			s += k
		}
		return s
	}())
	if msg := fmt.Sprint(states); states[gatewaytest.Succeeded] == 0 {
		t.Errorf("no command succeeded: %s", msg)
	}
}
