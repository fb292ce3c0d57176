package sim

import (
	"context"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// BenchmarkBulkAnswer measures metal.bulk's answer for 10,000 ready nodes of one pool (approvals
// required, so the batch is held and the engine does not compete for the store).
func BenchmarkBulkAnswer(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		st := storetest.Open(b, store.SQLite)
		h, err := Start(ctx, st, Config{}, engine.Config{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		ids, err := h.SeedReady(ctx, "b", 10000)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "retire", Nodes: ids, Reason: "bench"})
		b.ReportMetric(time.Since(t0).Seconds(), "s/bulk")
		if err != nil || res.Batch.Size != 10000 {
			b.Fatalf("bulk: %v size %d", err, res.Batch.Size)
		}
		b.StopTimer()
		h.Stop()
	}
}
