package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/testlog"
)

// An open stream whose certificate is refused since it opened ends at the gateway's next
// re-check, and the agent's reconnect is refused: a site agent an operator revoked, a
// ramdisk whose node's identity generation was bumped. The gateway logs the first as a
// warning; the second is how every release, rescue and retire goes (metal.revokeIdentity while
// the node's OS or ramdisk is up), logged as information.
func TestRevokedAgentsStreamEnds(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	var logs testlog.Buffer
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond, RecheckInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	for _, tc := range []struct {
		name   string
		issue  func(csr []byte) ([]byte, error)
		kind   agentlink.Kind
		revoke func()
		level  string // of the stream's end in the gateway's log
	}{
		{"site agent revoked", func(csr []byte) ([]byte, error) { return env.CA.IssueSiteAgent(csr, "s1", "a1", time.Hour, time.Now()) },
			agentlink.KindSite, func() { env.Identities.RevokeSiteAgent("a1") }, "WARN"},
		{"node generation bumped", func(csr []byte) ([]byte, error) {
			env.Identities.SetGeneration("n1", 1)
			return env.CA.IssueNode(csr, "n1", 1, time.Hour, time.Now())
		}, agentlink.KindNode, func() { env.Identities.SetGeneration("n1", 2) }, "INFO"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(logs.String())
			key, der := csr(t)
			cert, err := tc.issue(der)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cfg := linkConfig(env, writeIdentity(t, env, key, cert))
			cfg.Kind = tc.kind
			l, err := agentlink.Dial(ctx, cfg, agentlink.HandlerFunc(nil))
			if err != nil {
				t.Fatal(err)
			}
			open := func() int {
				n := 0
				for _, k := range env.Queue.Counts().Open {
					n += k
				}
				return n
			}
			for open() == 0 {
				select {
				case <-ctx.Done():
					t.Fatal("the agent's stream never opened")
				case <-time.After(10 * time.Millisecond):
				}
			}
			tc.revoke()
			if err := l.Wait(); !errors.Is(err, agentlink.ErrRefused) {
				t.Fatalf("link ended with %v, want ErrRefused", err)
			}
			var ended []string
			for line := range strings.Lines(logs.String()[before:]) {
				var rec struct{ Level, Msg string }
				if err := json.Unmarshal([]byte(line), &rec); err == nil && strings.Contains(rec.Msg, "ending its stream") {
					ended = append(ended, rec.Level)
				}
			}
			if len(ended) == 0 || slices.ContainsFunc(ended, func(l string) bool { return l != tc.level }) {
				t.Errorf("the stream's end logged at %v, want %s", ended, tc.level)
			}
		})
	}
}
