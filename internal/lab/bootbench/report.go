// Package bootbench measures, in the lab, the time from power-on to the ramdisk being online
// (its `bcd-ramdisk: ready` console line), per firmware, with bcd's site boot services (full
// DHCP, boot.ipxe from a ramdisk boot entry, artifacts from the site cache) against the baseline
// a user would build by hand (dnsmasq handing iPXE a static script, busybox httpd serving it and
// the same kernel, initramfs and command line). It reports figures; it asserts nothing about
// time: a run fails only when a machine never comes online.
//
// Run (host side) brings up a lab of one BIOS and one UEFI VM in a namespace of its own, runs
// Measure inside the namespace (a child process: every socket of the services is then on the
// lab's bridge), reads the samples and brings the lab down.
package bootbench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"bcd/internal/lab"
)

// Server is the set of boot services a sample was taken with.
type Server string

const (
	ServerBCD     Server = "bcd"     // internal/dhcp (full) + internal/netboot + site boot entries
	ServerDnsmasq Server = "dnsmasq" // dnsmasq DHCP + busybox httpd + a static iPXE script
)

// Servers is every server, in the order reports list them.
var Servers = []Server{ServerBCD, ServerDnsmasq}

// Phase names: console milestones, first seen after power-on. Only PhaseReady is required.
const (
	PhaseIPXE   = "ipxe"   // iPXE's banner: the firmware handed over to the NIC's iPXE
	PhaseScript = "script" // iPXE fetched boot.ipxe (its "…boot.ipxe… ok" line)
	PhaseKernel = "kernel" // the kernel's first line ("Linux version"): kernel and initrd downloaded
	PhaseReady  = "ready"  // "bcd-ramdisk: ready": the ramdisk has its address
)

// Sample is one boot.
type Sample struct {
	Server   Server                   `json:"server"`
	Firmware lab.Firmware             `json:"firmware"`
	Run      int                      `json:"run"`
	VM       string                   `json:"vm"`
	Ready    time.Duration            `json:"readyNs"`  // power-on → ready line
	Phases   map[string]time.Duration `json:"phasesNs"` // power-on → each milestone seen
	Line     string                   `json:"line"`     // the ready line (address it got)
}

// Summary is the figures of one (server, firmware).
type Summary struct {
	Server   Server        `json:"server"`
	Firmware lab.Firmware  `json:"firmware"`
	N        int           `json:"n"`
	Median   time.Duration `json:"medianNs"`
	Min      time.Duration `json:"minNs"`
	Max      time.Duration `json:"maxNs"`
	// PhaseMedians are the medians of the milestones seen in every sample.
	PhaseMedians map[string]time.Duration `json:"phaseMediansNs"`
}

// Ratio compares the medians of one firmware: bcd ÷ dnsmasq (below 1: bcd is faster).
type Ratio struct {
	Firmware lab.Firmware `json:"firmware"`
	BCD      float64      `json:"bcdOverDnsmasq"`
}

// Report is what a benchmark run produced.
type Report struct {
	Samples   []Sample  `json:"samples"`
	Summaries []Summary `json:"summaries"`
	Ratios    []Ratio   `json:"ratios"`
}

// Median of ds (the mean of the two middle values for an even count); 0 for none.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Summarize groups samples by (server, firmware) in the order of Servers and of firmware first
// seen, and computes the ratio of medians per firmware that has both servers. Pure.
func Summarize(samples []Sample) Report {
	var fws []lab.Firmware
	for _, s := range samples {
		if !slices.Contains(fws, s.Firmware) {
			fws = append(fws, s.Firmware)
		}
	}
	r := Report{Samples: samples}
	for _, fw := range fws {
		med := map[Server]time.Duration{}
		for _, srv := range Servers {
			var ready []time.Duration
			phases := map[string][]time.Duration{}
			for _, s := range samples {
				if s.Server != srv || s.Firmware != fw {
					continue
				}
				ready = append(ready, s.Ready)
				for p, d := range s.Phases {
					phases[p] = append(phases[p], d)
				}
			}
			if len(ready) == 0 {
				continue
			}
			sum := Summary{Server: srv, Firmware: fw, N: len(ready), Median: Median(ready),
				Min: slices.Min(ready), Max: slices.Max(ready), PhaseMedians: map[string]time.Duration{}}
			for p, ds := range phases {
				if len(ds) == len(ready) {
					sum.PhaseMedians[p] = Median(ds)
				}
			}
			med[srv] = sum.Median
			r.Summaries = append(r.Summaries, sum)
		}
		if b, d := med[ServerBCD], med[ServerDnsmasq]; b > 0 && d > 0 {
			r.Ratios = append(r.Ratios, Ratio{Firmware: fw, BCD: float64(b) / float64(d)})
		}
	}
	return r
}

func secs(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", d.Seconds())
}

// WriteTable prints the summaries and ratios for people (seconds).
func WriteTable(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIRMWARE\tSERVER\tRUNS\tMEDIAN s\tMIN s\tMAX s\tIPXE s\tSCRIPT s\tKERNEL s")
	for _, s := range r.Summaries {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Firmware, s.Server, s.N, secs(s.Median), secs(s.Min), secs(s.Max),
			secs(s.PhaseMedians[PhaseIPXE]), secs(s.PhaseMedians[PhaseScript]), secs(s.PhaseMedians[PhaseKernel]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, ra := range r.Ratios {
		fmt.Fprintf(w, "%s: bcd/dnsmasq median ratio %.2f\n", ra.Firmware, ra.BCD)
	}
	return nil
}
