package initsys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper collects exited children of PID 1: orphans re-parented to it. A command that PID 1
// starts itself must run through Exec, which pauses reaping while it runs so that its own
// Wait gets its exit status (wait4(-1) would otherwise steal it).
type Reaper struct {
	mu    sync.Mutex
	holds int
	wait  func() (pid int, err error) // one non-blocking wait for any child
}

// NewReaper returns a reaper using wait4(-1, WNOHANG).
func NewReaper() *Reaper {
	return &Reaper{wait: func() (int, error) {
		var ws unix.WaitStatus
		return unix.Wait4(-1, &ws, unix.WNOHANG, nil)
	}}
}

// Exec runs cmd to completion with reaping paused.
func (r *Reaper) Exec(cmd *exec.Cmd) error {
	r.mu.Lock()
	r.holds++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.holds--
		r.mu.Unlock()
	}()
	return cmd.Run()
}

// ReapAll reaps every exited child (unless an Exec is running) and returns how many.
func (r *Reaper) ReapAll() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holds > 0 {
		return 0
	}
	n := 0
	for {
		pid, err := r.wait()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return n
		}
		n++
	}
}

// DefaultPath is the PATH PID 1 runs with: the one it was given, else the usual one. Pure.
func DefaultPath(given string) string {
	if given != "" {
		return given
	}
	return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}

// Run is PID 1: Init, then the agent, while reaping children and ignoring the signals the
// kernel sends to init. It returns only when ctx ends (PID 1 passes a context that never
// does); a fatal error powers off or reboots after cfg.FatalDelay.
func Run(ctx context.Context, sys System, cfg Config, reaper *Reaper) {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGPWR, unix.SIGUSR1, unix.SIGUSR2)
	defer signal.Stop(sigs)
	// A ticker keeps a timer pending at all times, so the runtime never sees "all goroutines
	// are asleep", and catches any SIGCHLD that was coalesced away.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The kernel starts init with no PATH: programs an overlay adds (dcgmi, nv-hostengine) are
	// found by name on the usual one.
	if err := os.Setenv("PATH", DefaultPath(os.Getenv("PATH"))); err != nil {
		log.Warn("setting PATH", "err", err)
	}
	go func() {
		console, clog, err := Init(ctx, sys, cfg, log)
		if err != nil {
			Fatal(ctx, sys, console, cfg, err)
			return
		}
		if cfg.Agent == nil {
			return
		}
		if err := cfg.Agent(ctx, console, clog); err != nil && ctx.Err() == nil {
			Fatal(ctx, sys, console, cfg, fmt.Errorf("agent: %w", err))
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sigs:
			if s == unix.SIGCHLD {
				reaper.ReapAll()
			}
			// Others (Ctrl-Alt-Del's SIGINT, SIGTERM, SIGPWR…) are ignored: the control plane
			// decides when this machine powers off.
		case <-tick.C:
			reaper.ReapAll()
		}
	}
}
