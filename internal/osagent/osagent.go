package osagent

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/osagent/osjoin"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/agent"
)

// Config of the OS agent.
type Config struct {
	Cmdline func() (string, error) // reads /proc/cmdline
	Net     agent.Net
	DHCP    agent.DHCPClient
	HTTP    *http.Client // metadata reads; default: 10 s timeout
	// State keeps the identity across reboots when the command line says bcd.state=partition;
	// nil, failing or not asked for: in RAM (a reboot then needs a fresh instance token).
	State State

	RetryDelay time.Duration // first delay between attempts; default 1 s
	MaxDelay   time.Duration // cap of the doubling delays; default 10 s

	// Network tunes DHCP (its Net, DHCP and Cmdline are ignored).
	Network agent.Config
	// Link adjusts the agentlink configuration before dialing (tests: backoff, logger).
	Link func(*agentlink.Config)
}

func (c *Config) defaults() {
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = time.Second
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = 10 * time.Second
	}
}

// refuseAll is the command handler: an installed OS runs nothing the control plane sends (in
// particular nothing destructive).
var refuseAll = agentlink.HandlerFunc(func(_ context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
	return nil, fmt.Errorf("the installed OS agent runs no commands (%s refused)", cmd.Kind)
})

// Run is the OS agent. It returns only when ctx ends (nil) or when the kernel command line is
// unusable (retrying cannot fix it); every other failure is printed and retried.
func Run(ctx context.Context, console io.Writer, log *slog.Logger, cfg Config) error {
	cfg.defaults()
	say := func(format string, args ...any) { fmt.Fprintf(console, "bcd os: "+format+"\n", args...) }
	fmt.Fprintf(console, "%s (installed OS agent of the lab image)\n", MarkerStart)
	line, err := cfg.Cmdline()
	if err != nil {
		return fmt.Errorf("reading kernel command line: %w", err)
	}
	params, err := ParseCmdline(line)
	if err != nil {
		return err
	}

	dir, where := "", "RAM"
	if params.KeepIdentity && cfg.State != nil {
		d, w, err := cfg.State.Dir(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			say("no state partition (%v): the identity stays in RAM", err)
		} else {
			dir, where = d, w
		}
	}
	if dir == "" {
		say("identity kept in RAM: every boot joins with the instance token the metadata holds")
	} else {
		say("identity kept in %s", where)
	}

	ncfg := cfg.Network
	ncfg.Net, ncfg.DHCP = cfg.Net, cfg.DHCP
	delay := cfg.RetryDelay
	var leases []agent.Lease
	for {
		leases, err = agent.ConfigureNetwork(ctx, log, ncfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		say("network not up yet (%v); retrying in %s", err, delay)
		if sleep(ctx, delay) != nil {
			return nil
		}
		delay = min(delay*2, cfg.MaxDelay)
	}
	addrs := make([]string, len(leases))
	servers := make([]netip.Addr, len(leases))
	for i, l := range leases {
		addrs[i], servers[i] = l.Interface+":"+l.Address.String(), l.Server
	}
	murl, err := MetadataURL(params, servers)
	if err != nil {
		return err
	}
	say("network up ip=%s metadata=%s", strings.Join(addrs, ","), murl)

	// One key for every join attempt: a join whose answer was lost can be retried with the
	// same one-time token by the same key. With a state directory the key is agentlink's,
	// written there before the join, so that the retry works across a reboot too (a key in
	// RAM would find the token spent by the lost join and lock the node out until its
	// instance is prepared again); without one it lives in RAM for this boot.
	var key crypto.Signer
	if dir == "" {
		if key, _, err = pki.NewKeyAndCSR("bcd os"); err != nil {
			return fmt.Errorf("generating the node key: %w", err)
		}
	}
	delay = cfg.RetryDelay
	var last Metadata
	for ctx.Err() == nil {
		md, err := FetchMetadata(ctx, cfg.HTTP, murl)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrNotPublished) {
				say("metadata not published yet (404 from %s); retrying in %s", murl, delay)
			} else {
				say("metadata from %s: %v; retrying in %s", murl, err, delay)
			}
			delay = backoff(ctx, delay, cfg.MaxDelay)
			continue
		}
		if md != last {
			say("metadata: node %s, gateway %s", md.NodeID, md.Gateway)
			log.InfoContext(ctx, "metadata", "metadata", md)
			last = md
		}
		kept := dir != "" && hasIdentity(dir)
		if dir != "" && !kept {
			// The key of an earlier join attempt (agentlink reuses it, so a join whose answer
			// was lost is accepted again) that a power loss damaged would fail every join:
			// with no certificate beside it, nothing is lost by making a new one.
			if damaged, err := removeDamagedJoinKey(dir); err != nil {
				say("cannot remove the damaged join key in %s: %v", where, err)
			} else if damaged {
				say("the join key kept in %s was damaged: a new one is made", where)
			}
		}
		link, err := agentlink.Dial(ctx, linkConfig(cfg, md, dir, key, log), refuseAll)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			switch {
			case kept && keptCertExpired(dir, time.Now()):
				// Past its end by this machine's clock, the certificate made agentlink join
				// again with the metadata's token, and that failed (a spent token, the network,
				// or a clock that is wrong, not the certificate: agentlink put it back). It
				// stays: forgotten, the node could never reconnect once the clock is right.
				say("the certificate kept in %s has expired by this machine's clock and joining again failed (%v): keeping it; retrying in %s", where, err, delay)
			case kept:
				// With a kept identity Dial does not touch the network: the files are unusable
				// (a power loss mid-write). Start over with the metadata's token.
				say("the identity kept in %s is unusable (%v): forgetting it and joining with the metadata's token", where, err)
				if rerr := os.RemoveAll(dir); rerr != nil {
					say("cannot remove %s: %v", dir, rerr)
				}
			case errors.Is(err, agentlink.ErrRefused):
				say("the gateway refused the instance token (used or expired: the control plane must prepare the instance again): %v; retrying in %s", err, delay)
			default:
				say("cannot join the gateway (%v); retrying in %s", err, delay)
			}
			delay = backoff(ctx, delay, cfg.MaxDelay)
			continue
		}
		node := link.Identity().NodeID
		if kept {
			say("reconnecting as node %s with the identity kept in %s", node, where)
		} else {
			fmt.Fprintf(console, "%s %s\n", MarkerJoined, node)
		}
		delay = cfg.RetryDelay
		err = link.Wait()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, agentlink.ErrRefused) && dir != "" {
			say("the gateway refused node %s's certificate (%v): forgetting the identity in %s and joining again with the metadata's token", node, err, where)
			if rerr := os.RemoveAll(dir); rerr != nil {
				say("cannot remove %s: %v", dir, rerr)
			}
		} else {
			say("the link to the control plane ended (%v); reconnecting in %s", err, delay)
		}
		delay = backoff(ctx, delay, cfg.MaxDelay)
	}
	return nil
}

func linkConfig(cfg Config, md Metadata, dir string, key crypto.Signer, log *slog.Logger) agentlink.Config {
	lc := osjoin.LinkConfig(md, key, dir, log)
	lc.AgentVersion = "bcd-os"
	lc.MaxBackoff = cfg.MaxDelay
	if cfg.Link != nil {
		cfg.Link(&lc)
	}
	return lc
}

// hasIdentity reports whether agentlink left a certificate in dir.
func hasIdentity(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, agentlink.CertFile))
	return err == nil
}

// keptCertExpired reports whether the identity agentlink keeps in dir is whole (a key, the
// certificate of that key, a CA) and its certificate is past its end at now.
func keptCertExpired(dir string, now time.Time) bool {
	read := func(name string) []byte {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return b
	}
	if len(read(agentlink.CAFile)) == 0 {
		return false
	}
	key, err := pki.ParseKeyPEM(read(agentlink.KeyFile))
	if err != nil {
		return false
	}
	der, err := pki.DecodeCertPEM(read(agentlink.CertFile))
	if err != nil {
		return false
	}
	c, err := pki.TLSCertificate(der, key)
	return err == nil && now.After(c.Leaf.NotAfter)
}

// removeDamagedJoinKey removes agentlink's key file from dir when it holds no parseable key.
func removeDamagedJoinKey(dir string) (bool, error) {
	p := filepath.Join(dir, agentlink.KeyFile)
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		// Unreadable (an I/O error on a damaged file system): out of the way too.
		return true, os.Remove(p)
	}
	if _, err := pki.ParseKeyPEM(b); err == nil {
		return false, nil
	}
	return true, os.Remove(p)
}

// backoff sleeps d (or until ctx ends) and returns the next delay.
func backoff(ctx context.Context, d, ceiling time.Duration) time.Duration {
	_ = sleep(ctx, d)
	return min(d*2, ceiling)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
