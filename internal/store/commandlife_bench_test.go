package store

import (
	"context"
	"testing"
)

// BenchmarkCommandLife runs in the writer the lives of 64 site commands in one write each: queued,
// claimed, acknowledged, reported running and reported succeeded, each report reading the
// command first as the engine does. writer-ns/command is the writer thread's CPU time per
// command (Store.WriterStats), which the wait for the WAL's flush does not count.
func BenchmarkCommandLife(b *testing.B) {
	ctx := context.Background()
	s, node := openWithNode(b)
	const perWrite = 64
	site := Acknowledger{AgentID: "site-a"}
	life := func(tx *Tx) error {
		cs := make([]Command, perWrite)
		for i := range cs {
			cs[i] = Command{NodeID: node.ID, TenantID: node.TenantID, SiteID: node.SiteID, Kind: "bmc.power", Subject: node.ID, RunsOn: "site",
				Args: `{"op":"on","reason":"a step of a workflow"}`}
			if err := tx.InsertCommand(ctx, &cs[i]); err != nil {
				return err
			}
		}
		for i := range cs {
			if _, err := tx.AssignCommands(ctx, site.AgentID, cs[i:i+1]); err != nil {
				return err
			}
		}
		for i := range cs {
			if _, err := tx.DeliverCommands(ctx, []string{cs[i].ID}, site); err != nil {
				return err
			}
		}
		for _, state := range []string{"running", "succeeded"} {
			for i := range cs {
				c, err := tx.Command(ctx, cs[i].ID)
				if err != nil {
					return err
				}
				c.State = state
				if state == "succeeded" {
					c.Result, c.FinishedAt = `{"power":"on"}`, tx.At()
				}
				if err := tx.ReportCommand(ctx, &c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	s.MeasureWriterCPU(true) // the writer's CPU is counted only when asked
	cpu := s.WriterStats().CPU
	for b.Loop() {
		if err := s.Write(ctx, life); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.WriterStats().CPU-cpu)/float64(b.N*perWrite), "writer-ns/command")
}
