package sim

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// Phase is one measured phase over every node.
type Phase struct {
	Name        string        `json:"name"`
	Nodes       int           `json:"nodes"`
	Total       time.Duration `json:"totalNs"`
	NodesPerSec float64       `json:"nodesPerSec"`
	P50         time.Duration `json:"p50Ns"`
	P99         time.Duration `json:"p99Ns"`
	Failed      int           `json:"failed"`
}

func (p Phase) String() string {
	return fmt.Sprintf("%-22s %6d nodes in %8s = %7.0f nodes/s  p50 %8s  p99 %8s  failed %d",
		p.Name, p.Nodes, p.Total.Round(time.Millisecond), p.NodesPerSec, p.P50.Round(time.Millisecond), p.P99.Round(time.Millisecond), p.Failed)
}

// Report is a whole run.
type Report struct {
	Engine      string        `json:"engine"`
	Nodes       int           `json:"nodes"`
	Phases      []Phase       `json:"phases"`
	PeakRSSMiB  float64       `json:"peakRssMiB"`
	Commands    int           `json:"commands"`
	RanTwice    int           `json:"commandsRunTwice"`
	EnrollTotal time.Duration `json:"enrollApiNs"`
}

// RunPhases enrolls n nodes and takes them through enroll → ready, deploy → deployed and
// undeploy → ready, timing each phase from the verbs to the last node resting.
func (h *Harness) RunPhases(ctx context.Context, n int, timeout time.Duration, progress func(phase string, done, total int)) (Report, error) {
	rep := Report{Engine: string(h.Store.Engine()), Nodes: n}
	t0 := time.Now()
	ids, err := h.Enroll(ctx, "sim", n)
	if err != nil {
		return rep, err
	}
	rep.EnrollTotal = time.Since(t0)
	phase, err := h.measure(ctx, "enroll → ready", ids, t0, "ready", timeout, progress)
	rep.Phases = append(rep.Phases, phase)
	if err != nil {
		return rep, err
	}
	t1 := time.Now()
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "sim-image"}); err != nil {
		return rep, err
	}
	phase, err = h.measure(ctx, "deploy → deployed", ids, t1, "deployed", timeout, progress)
	rep.Phases = append(rep.Phases, phase)
	if err != nil {
		return rep, err
	}
	t2 := time.Now()
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{Wipe: "quick"}); err != nil {
		return rep, err
	}
	phase, err = h.measure(ctx, "undeploy → ready", ids, t2, "ready", timeout, progress)
	rep.Phases = append(rep.Phases, phase)
	execs := h.Sim.Executions()
	rep.Commands = len(execs)
	for _, c := range execs {
		if c > 1 {
			rep.RanTwice++
		}
	}
	rep.PeakRSSMiB = peakRSSMiB()
	return rep, err
}

// measure waits until every node rests and computes the phase's figures from the nodes'
// update times.
func (h *Harness) measure(ctx context.Context, name string, ids []string, start time.Time, want string, timeout time.Duration, progress func(string, int, int)) (Phase, error) {
	p := Phase{Name: name, Nodes: len(ids)}
	deadline := time.Now().Add(timeout)
	for {
		counts, err := h.Store.CountByState(ctx)
		if err != nil {
			return p, err
		}
		rested := counts[want] + counts["failed"]
		if progress != nil {
			progress(name, rested, len(ids))
		}
		if rested >= len(ids) {
			break
		}
		select {
		case err := <-h.Sim.Errors():
			return p, fmt.Errorf("%s: simulated agent: %w", name, err)
		default:
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("%s: %d of %d nodes rested after %s (%v)", name, rested, len(ids), timeout, counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.Total = time.Since(start)
	p.NodesPerSec = float64(len(ids)) / p.Total.Seconds()
	var lat []time.Duration
	after := ""
	for {
		nodes, err := h.Store.Nodes(ctx, store.NodeFilter{AfterID: after, Limit: 5000})
		if err != nil {
			return p, err
		}
		for _, n := range nodes {
			if n.State == "failed" {
				p.Failed++
			}
			lat = append(lat, store.Micros(n.UpdatedAt).Sub(start))
		}
		if len(nodes) < 5000 {
			break
		}
		after = nodes[len(nodes)-1].ID
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		p.P50, p.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return p, nil
}

// peakRSSMiB reads the process's peak resident set (VmHWM).
func peakRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}
