package secrets

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// SealedValue is one sealed value of the store and the id it was sealed for.
type SealedValue struct {
	ID     string
	Sealed []byte
}

// SealedGroup is a group of the store's sealed values naming the same key (or none: legacy),
// with one or two of them as samples.
type SealedGroup struct {
	What    string // what the values are, plural: "secrets", "agent CA keys"
	Count   int
	Samples []SealedValue
}

// SealedKeys is what CheckStore needs of the store.
type SealedKeys interface {
	// SealedKeyGroups groups the store's sealed values by the key they name.
	SealedKeyGroups(ctx context.Context) ([]SealedGroup, error)
}

// CheckStore refuses a keyring that does not hold a key the store's sealed values name (a
// server started with the key file of before a rotation, or beside a store restored from a
// backup older than one). A group whose key the keyring does not hold by id (legacy values,
// or a legacy value that happens to start like a keyed one) passes if one of its samples
// opens. It reads one row per key, not every value: a single altered value is not looked for.
func CheckStore(ctx context.Context, st SealedKeys, s *Sealer) error {
	groups, err := st.SealedKeyGroups(ctx)
	if err != nil {
		return fmt.Errorf("checking the sealing keyring against the store: %w", err)
	}
	ring := strings.Join(s.ids(), ", ")
	var problems []string
	for _, g := range groups {
		if len(g.Samples) == 0 {
			continue
		}
		held, legacy := s.Holds(g.Samples[0].Sealed)
		if held || opensOne(s, g.Samples) {
			continue
		}
		if legacy {
			problems = append(problems, fmt.Sprintf("%d %s (%s among them) were sealed before sealing keyrings and open under none of its keys",
				g.Count, g.What, g.Samples[0].ID))
		} else {
			problems = append(problems, fmt.Sprintf("%d %s (%s among them) are sealed under key %s, which it does not hold",
				g.Count, g.What, g.Samples[0].ID, KeyIDOf(g.Samples[0].Sealed)))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the sealing keyring (keys %s) does not open what the store holds: %s: start every server with the key file `bcd secrets rotate-key` wrote last (--seal-key-file or BCD_SEAL_KEY); a store restored from a backup older than a key rotation needs the old key back, on a line after the first (then run bcd secrets rotate-key): %w",
			ring, strings.Join(problems, "; "), ErrKeyMissing)
	}
	return nil
}

func opensOne(s *Sealer, samples []SealedValue) bool {
	for _, v := range samples {
		if plain, err := s.Open(v.ID, v.Sealed); err == nil {
			clear(plain)
			return true
		}
	}
	return false
}

func (s *Sealer) ids() []string {
	out := make([]string, len(s.keys))
	for i, k := range s.keys {
		out[i] = fmt.Sprintf("%x", k.id[:])
	}
	return out
}

// ResealFunc returns a value of secret id sealed anew, or nil to leave it as it is.
type ResealFunc func(id string, sealed []byte) ([]byte, error)

// RotationStore is what Rotate needs of the store.
type RotationStore interface {
	// SecretCount is the number of sealed secrets.
	SecretCount(ctx context.Context) (int, error)
	// ResealSecrets passes, in one transaction, over at most limit secrets after id after (""
	// from the first), in id order, and writes what reseal returns for each. It returns the
	// last id it passed ("": none was left), how many it passed and how many it changed; on
	// an error it changed none.
	ResealSecrets(ctx context.Context, after string, limit int, reseal ResealFunc) (last string, seen, changed int, err error)
	// ResealCA does the same, in one transaction, to the installation CA's sealed keys.
	ResealCA(ctx context.Context, reseal ResealFunc) (changed int, err error)
}

// DefaultBatch is how many secrets Rotate re-seals in one transaction.
const DefaultBatch = 500

// RotateConfig configures Rotate.
type RotateConfig struct {
	KeyFile string
	Store   RotationStore
	// Batch is how many secrets one transaction re-seals (default DefaultBatch).
	Batch int
	// Progress is told, after each batch, what the rotation did so far.
	Progress func(Progress)
	// Stopped is asked, before the old keys leave the keyring, whether every server is still
	// stopped (one started meanwhile with the old keyring would seal under a removed key).
	Stopped func(ctx context.Context) error

	// crash, if set, is called at each step of the rotation; an error stops it there, as a
	// crash would (a test seam: nothing outside this package's tests sets it).
	crash func(step string) error
}

// Steps of a rotation, as Progress and the crash seam name them.
const (
	StepCheck    = "check"     // every value opens under the keyring as it is
	StepAddKey   = "add-key"   // the new key is in the keyring, sealing
	StepReseal   = "reseal"    // re-sealing under the new key
	StepVerify   = "verify"    // every value opens under the new key
	StepTrimRing = "trim-ring" // the old keys left the keyring
)

// Progress is where a rotation is.
type Progress struct {
	Step            string
	Seen, Total     int // secrets passed in this step, of the store's
	Resealed        int // secrets re-sealed by this run so far
	CAKeysResealed  int
	NewKey, OldKeys string // ids; OldKeys comma-separated
	Resumed         bool   // the keyring already held the new key (Rotation.Resumed)
}

// Rotation is what Rotate did.
type Rotation struct {
	NewKey   string   // the id of the sealing key, the keyring's only one now
	OldKeys  []string // the ids of the keys removed
	Resumed  bool     // an earlier run had added the key: this one finished its work
	Secrets  int      // secrets in the store
	Resealed int      // secrets this run re-sealed
	CAKeys   int      // installation CA keys this run re-sealed
}

// Rotate replaces the sealing key, with every server stopped: it adds a new key to the keyring
// (durably, as the key that seals), re-seals every secret and the installation CA's keys under
// it in batches (one transaction each), checks that every value opens under it, and removes
// the other keys from the keyring. A keyring already holding several keys is a rotation left
// unfinished (a crash, an error): Rotate finishes it, adding no key. At every point the key
// file opens every value of the store; run again after a crash, Rotate finishes the job.
func Rotate(ctx context.Context, cfg RotateConfig) (Rotation, error) {
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.crash == nil {
		cfg.crash = func(string) error { return nil }
	}
	crash := cfg.crash
	if err := checkKeyFile(cfg.KeyFile); err != nil {
		return Rotation{}, err
	}
	ring, err := LoadKeyring(cfg.KeyFile)
	if err != nil {
		return Rotation{}, err
	}
	total, err := cfg.Store.SecretCount(ctx)
	if err != nil {
		return Rotation{}, err
	}
	var rot Rotation
	rot.Secrets = total
	sealer, err := NewKeyringSealer(ring)
	if err != nil {
		return Rotation{}, err
	}
	p := Progress{Total: total}
	tell := func(step string) {
		p.Step = step
		if cfg.Progress != nil {
			cfg.Progress(p)
		}
	}
	// Every value opens as things are, or nothing changes: a value no key opens would stop
	// the rotation half-way.
	opens := func(id string, sealed []byte) ([]byte, error) {
		plain, err := sealer.Open(id, sealed)
		if err != nil {
			return nil, fmt.Errorf("the value sealed for %s does not open with the sealing keyring %s (nothing was changed: a value no key opens cannot be re-sealed): %w", id, cfg.KeyFile, err)
		}
		clear(plain)
		return nil, nil
	}
	if _, _, err := pass(ctx, cfg, opens, &p, StepCheck, tell); err != nil {
		return Rotation{}, err
	}
	if ring.Len() > 1 {
		rot.Resumed, p.Resumed = true, true
	} else {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return Rotation{}, fmt.Errorf("generating the new sealing key: %w", err)
		}
		if ring, err = NewKeyring(append([][]byte{key}, ring.keys...)...); err != nil {
			return Rotation{}, err
		}
		clear(key)
		if err := WriteKeyring(cfg.KeyFile, ring); err != nil {
			return Rotation{}, err
		}
		if sealer, err = NewKeyringSealer(ring); err != nil {
			return Rotation{}, err
		}
	}
	ids := ring.IDs()
	rot.NewKey, rot.OldKeys = ids[0], ids[1:]
	p.NewKey, p.OldKeys = rot.NewKey, strings.Join(rot.OldKeys, ", ")
	tell(StepAddKey)
	if err := crash(StepAddKey); err != nil {
		return rot, err
	}
	reseal := func(id string, sealed []byte) ([]byte, error) {
		if err := crash(StepReseal + "-row"); err != nil {
			return nil, err
		}
		out, changed, err := sealer.Reseal(id, sealed)
		if err != nil {
			return nil, fmt.Errorf("re-sealing the value sealed for %s: %w", id, err)
		}
		if !changed {
			return nil, nil
		}
		return out, nil
	}
	// A pass that re-seals nothing found every value opening under the new key. A value sealed
	// meanwhile under an old key (a server started against the advice) is caught by the next
	// pass: pass until one changes nothing.
	for round := 0; ; round++ {
		if round == 3 {
			return rot, errors.New("values sealed under the old keys keep appearing in the store: is a server running with the old key file? Stop every server, then run bcd secrets rotate-key again")
		}
		step := StepReseal
		if round > 0 {
			if err := crash(StepVerify); err != nil {
				return rot, err
			}
			step = StepVerify
		}
		changed, ca, err := pass(ctx, cfg, reseal, &p, step, tell)
		rot.Resealed += changed
		rot.CAKeys += ca
		if err != nil {
			return rot, err
		}
		if changed+ca == 0 {
			break
		}
	}
	if cfg.Stopped != nil {
		if err := cfg.Stopped(ctx); err != nil {
			return rot, fmt.Errorf("every value is sealed under key %s, but the old keys stay in the keyring: %w", rot.NewKey, err)
		}
	}
	if err := crash(StepTrimRing); err != nil {
		return rot, err
	}
	final, err := NewKeyring(ring.keys[0])
	if err != nil {
		return rot, err
	}
	if err := WriteKeyring(cfg.KeyFile, final); err != nil {
		return rot, err
	}
	tell(StepTrimRing)
	return rot, nil
}

// pass runs reseal over every secret, batch by batch, then over the installation CA's keys,
// telling p after each batch.
func pass(ctx context.Context, cfg RotateConfig, reseal ResealFunc, p *Progress, step string, tell func(string)) (changed, ca int, err error) {
	p.Seen = 0
	after := ""
	for {
		last, seen, n, err := cfg.Store.ResealSecrets(ctx, after, cfg.Batch, reseal)
		if err != nil {
			return changed, ca, err
		}
		changed += n
		p.Resealed += n
		p.Seen += seen
		if last == "" {
			break
		}
		tell(step)
		if n > 0 {
			if err := cfg.crash(StepReseal + "-batch"); err != nil {
				return changed, ca, err
			}
		}
		after = last
	}
	ca, err = cfg.Store.ResealCA(ctx, reseal)
	p.CAKeysResealed += ca
	return changed, ca, err
}

// checkKeyFile refuses to rewrite a key file the server could then not read, or that others
// could have replaced: one that is not a regular file, belongs to another user (the file
// written would be this user's), or lies in a directory group or others may write in.
func checkKeyFile(path string) error {
	st, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("the sealing key file %s: %w (give the server's --data-dir or --seal-key-file)", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("the sealing key file %s is not a regular file (%v): rotate-key replaces the file itself; give the path of the file", path, st.Mode().Type())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return fmt.Errorf("the sealing key file %s belongs to uid %d, not to this user (uid %d): run rotate-key as the server's user, or the rewritten file would be unreadable to the server", path, sys.Uid, os.Getuid())
	}
	dir := filepath.Dir(path)
	dst, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("the sealing key's directory: %w", err)
	}
	if dst.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("the sealing key's directory %s has mode %v: group or others may write in it and replace the key (chmod go-w %s)", dir, dst.Mode().Perm(), dir)
	}
	return nil
}
