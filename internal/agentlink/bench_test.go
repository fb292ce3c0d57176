package agentlink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
)

// BenchmarkStream measures commands/s round trip through one stream: enqueue → claim → send →
// journal → ack → run (no-op) → journal the result → update → queue, on loopback TLS/HTTP/2.
// "durable" keeps the journal on disk (fsync, group commit); "ram" is the ramdisk's setting.
func BenchmarkStream(b *testing.B) {
	for _, durable := range []bool{true, false} {
		name := "ram"
		if durable {
			name = "durable"
		}
		b.Run(name, func(b *testing.B) {
			env := gatewaytest.Start(b, gateway.Config{PollInterval: time.Second})
			dir := ""
			if durable {
				dir = b.TempDir()
			}
			cfg := siteConfig(b, env, dir)
			cfg.MaxConcurrent = 256
			h := agentlink.HandlerFunc(func(context.Context, agentlink.Command, func(agentlink.Progress)) ([]byte, error) {
				return []byte(`{"ok":true}`), nil
			})
			ctx, cancel := context.WithCancel(context.Background())
			l := dial(b, ctx, cfg, h)
			cmds := make([]gateway.Command, b.N)
			for i := range cmds {
				cmds[i] = gateway.Command{ID: fmt.Sprintf("b-%09d", i), Kind: "bmc.query", NodeID: "n1", Args: []byte(`{"op":"power"}`)}
			}
			b.ResetTimer()
			t0 := time.Now()
			env.Queue.Enqueue(siteRef, cmds...)
			waitFinal(b, env.Queue, b.N)
			elapsed := time.Since(t0)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commands/s")
			stop(b, cancel, l)
			_ = gatewaytest.Failed
		})
	}
}
