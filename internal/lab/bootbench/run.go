package bootbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"bcd/internal/lab"
)

// Config is a benchmark run from the host.
type Config struct {
	Dir        string // the lab's directory (absolute)
	NetNS      string
	RamdiskDir string // absolute
	Runs       int
	Firmwares  []lab.Firmware
	Servers    []Server
	// Supervisor is `bcd lab supervise` (lab.UpConfig.Supervisor); Inner is this benchmark's own
	// command, to which Run appends InnerArgs and which must call Measure (inside the namespace).
	Supervisor []string
	Inner      []string
	Stderr     io.Writer // the inner half's log
	Log        *slog.Logger
}

// InnerArgs are the flags Run passes to the inner half; ParseList reads the lists back.
func InnerArgs(c Config) []string {
	fws := make([]string, len(c.Firmwares))
	for i, f := range c.Firmwares {
		fws[i] = string(f)
	}
	srvs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		srvs[i] = string(s)
	}
	return []string{"--inner", "--dir", c.Dir, "--ramdisk", c.RamdiskDir, "--runs", strconv.Itoa(c.Runs),
		"--firmware", strings.Join(fws, ","), "--server", strings.Join(srvs, ",")}
}

// ParseFirmwares reads a --firmware list (bios, uefi).
func ParseFirmwares(list []string) ([]lab.Firmware, error) {
	var out []lab.Firmware
	for _, f := range list {
		fw := lab.Firmware(strings.TrimSpace(f))
		if fw != lab.FirmwareBIOS && fw != lab.FirmwareUEFI {
			return nil, fmt.Errorf("firmware %q: accepted are bios, uefi", f)
		}
		if !slices.Contains(out, fw) {
			out = append(out, fw)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no firmware: accepted are bios, uefi")
	}
	return out, nil
}

// ParseServers reads a --server list (bcd, dnsmasq).
func ParseServers(list []string) ([]Server, error) {
	var out []Server
	for _, s := range list {
		srv := Server(strings.TrimSpace(s))
		if !slices.Contains(Servers, srv) {
			return nil, fmt.Errorf("server %q: accepted are bcd, dnsmasq", s)
		}
		if !slices.Contains(out, srv) {
			out = append(out, srv)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no server: accepted are bcd, dnsmasq")
	}
	return out, nil
}

// Run brings up a lab of one BIOS and one UEFI VM, runs the inner half in its namespace, and
// brings the lab down whatever happened. It fails only when the lab does not come up or a boot
// never completes.
func Run(ctx context.Context, c Config) (Report, error) {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, name := range []string{kernelName, initrdName} {
		if _, err := os.Stat(filepath.Join(c.RamdiskDir, name)); err != nil {
			return Report{}, fmt.Errorf("benchmarking boots: ramdisk %s missing (make ramdisk): %w", name, err)
		}
	}
	_, _, err := lab.Up(ctx, lab.Options{VMs: 2, Firmware: lab.ChoiceMixed, Dir: c.Dir, NetNS: c.NetNS},
		lab.UpConfig{Supervisor: c.Supervisor, Log: log})
	if err != nil {
		return Report{}, fmt.Errorf("benchmarking boots: %w", err)
	}
	defer func() {
		if err := lab.Down(context.WithoutCancel(ctx), c.Dir, log); err != nil {
			log.Error("bringing the benchmark lab down", "err", err)
		}
	}()
	out := filepath.Join(c.Dir, samplesFile)
	_ = os.Remove(out)
	argv := append(slices.Clone(c.Inner), InnerArgs(c)...)
	cmd := lab.Command(ctx, c.NetNS, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = c.Stderr, c.Stderr
	runErr := cmd.Run()
	samples, readErr := ReadSamples(c.Dir)
	if runErr != nil {
		return Summarize(samples), fmt.Errorf("benchmarking boots: inside the lab: %w", runErr)
	}
	if readErr != nil {
		return Report{}, fmt.Errorf("benchmarking boots: %w", readErr)
	}
	return Summarize(samples), nil
}

// WriteSamples stores the inner half's samples in the lab directory.
func WriteSamples(dir string, samples []Sample) error {
	b, err := json.MarshalIndent(samples, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, samplesFile), append(b, '\n'), 0o644)
}

// ReadSamples reads what WriteSamples stored.
func ReadSamples(dir string) ([]Sample, error) {
	b, err := os.ReadFile(filepath.Join(dir, samplesFile))
	if err != nil {
		return nil, fmt.Errorf("reading boot samples: %w", err)
	}
	var s []Sample
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding boot samples: %w", err)
	}
	return s, nil
}
