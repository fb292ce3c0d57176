package secrets_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// fixture is a store holding secrets sealed under one key, kept in a key file of the format of
// before keyrings: half of them legacy values (sealed before keyrings), half keyed, and the
// installation CA with an active and a staged key (legacy and keyed).
type fixture struct {
	st      *store.Store
	keyFile string
	oldKey  []byte
	want    map[string]string // secret id → plaintext
}

const caKey, caNext = "ca-active-key-pem", "ca-next-key-pem"

func legacySeal(t *testing.T, key []byte, id, plain string) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, aead.NonceSize())
	rand.Read(nonce)
	return aead.Seal(nonce, nonce, []byte(plain), []byte(id))
}

func newFixture(t *testing.T, st *store.Store, n int) fixture {
	t.Helper()
	ctx := context.Background()
	fx := fixture{st: st, keyFile: filepath.Join(t.TempDir(), "seal.key"), oldKey: make([]byte, secrets.KeySize), want: map[string]string{}}
	rand.Read(fx.oldKey)
	if err := os.WriteFile(fx.keyFile, []byte(base64.StdEncoding.EncodeToString(fx.oldKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sealer, err := secrets.NewSealer(fx.oldKey)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Write(ctx, func(tx *store.Tx) error {
		for i := range n {
			id, plain := fmt.Sprintf("s%03d", i), fmt.Sprintf("bmc-password-%03d", i)
			sealed := legacySeal(t, fx.oldKey, id, plain)
			if i%2 == 1 {
				if sealed, err = sealer.Seal(id, []byte(plain)); err != nil {
					return err
				}
			}
			if err := tx.InsertSecret(ctx, id, "tenant", sealed); err != nil {
				return fmt.Errorf("row %d (%x): %w", i, sealed, err)
			}
			fx.want[id] = plain
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := st.OfferInstallationCA(ctx, store.InstallationCA{CertPEM: "active-cert", SealedKey: legacySeal(t, fx.oldKey, store.CASealID, caKey)})
	if err != nil {
		t.Fatal(err)
	}
	next, err := sealer.Seal(store.CASealID, []byte(caNext))
	if err != nil {
		t.Fatal(err)
	}
	ca.NextCertPEM, ca.NextSealedKey = "next-cert", next
	if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.UpdateInstallationCA(ctx, ca); return err }); err != nil {
		t.Fatal(err)
	}
	return fx
}

// opensAll checks what a server started now would: the keyring in the key file passes the
// start check, and opens every secret and the CA's keys to their values. It returns the
// keyring's sealer.
func (fx fixture) opensAll(t *testing.T) *secrets.Sealer {
	t.Helper()
	ctx := context.Background()
	ring, err := secrets.LoadKeyring(fx.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := secrets.NewKeyringSealer(ring)
	if err != nil {
		t.Fatal(err)
	}
	if err := secrets.CheckStore(ctx, fx.st, s); err != nil {
		t.Fatalf("start check with %v: %v", ring, err)
	}
	for id, plain := range fx.want {
		sealed, err := fx.st.Sealed(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.Open(id, sealed); err != nil || string(got) != plain {
			t.Fatalf("secret %s with %v: %q %v", id, ring, got, err)
		}
	}
	ca, ok, err := fx.st.InstallationCA(ctx)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for plain, sealed := range map[string][]byte{caKey: ca.SealedKey, caNext: ca.NextSealedKey} {
		if got, err := s.Open(store.CASealID, sealed); err != nil || string(got) != plain {
			t.Fatalf("CA key with %v: %q %v", ring, got, err)
		}
	}
	return s
}

// allUnder checks that every value names key id alone.
func (fx fixture) allUnder(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	groups, err := fx.st.SealedKeyGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range groups {
		for _, v := range g.Samples {
			if got := secrets.KeyIDOf(v.Sealed); got != id {
				t.Errorf("%s %s sealed under %q, want %s", g.What, v.ID, got, id)
			}
		}
		if g.What == "secrets" {
			n += g.Count
		}
	}
	if n != len(fx.want) {
		t.Errorf("%d secrets under key %s, want %d", n, id, len(fx.want))
	}
}

// bcd secrets rotate-key's work: every secret and the CA's keys re-sealed under a new key, in
// batches, their values unchanged, the old key gone from the key file (0600), which a server
// then starts with; the keyring of before the rotation is refused at start, naming the key.
func TestRotate(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		const n = 23
		fx := newFixture(t, st, n)
		before, _, _ := st.InstallationCA(ctx)
		var steps []secrets.Progress
		rot, err := secrets.Rotate(ctx, secrets.RotateConfig{KeyFile: fx.keyFile, Store: st, Batch: 5,
			Progress: func(p secrets.Progress) { steps = append(steps, p) }})
		if err != nil {
			t.Fatal(err)
		}
		oldID := secrets.KeyID(fx.oldKey)
		if rot.Resumed || rot.Secrets != n || rot.Resealed != n || rot.CAKeys != 2 || rot.NewKey == oldID || len(rot.OldKeys) != 1 || rot.OldKeys[0] != oldID {
			t.Errorf("rotation: %+v", rot)
		}
		ring, err := secrets.LoadKeyring(fx.keyFile)
		if err != nil || ring.Len() != 1 || ring.IDs()[0] != rot.NewKey {
			t.Fatalf("key file after: %v %v", ring, err)
		}
		if st, err := os.Stat(fx.keyFile); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("key file mode %v %v", st.Mode().Perm(), err)
		}
		fx.opensAll(t)
		fx.allUnder(t, rot.NewKey)
		after, _, _ := st.InstallationCA(ctx)
		if after.Version != before.Version+1 || after.CertPEM != before.CertPEM || after.NextCertPEM != before.NextCertPEM {
			t.Errorf("CA row: version %d → %d", before.Version, after.Version)
		}
		// Progress: batch by batch (5 rows), re-sealed counts growing to n, each step told.
		told := map[string]bool{}
		last := 0
		for _, p := range steps {
			told[p.Step] = true
			if p.Resealed < last || p.Seen > p.Total {
				t.Errorf("progress went back: %+v", p)
			}
			last = p.Resealed
		}
		for _, step := range []string{secrets.StepCheck, secrets.StepAddKey, secrets.StepReseal, secrets.StepVerify, secrets.StepTrimRing} {
			if !told[step] {
				t.Errorf("step %s not told (%v)", step, told)
			}
		}
		if last != n {
			t.Errorf("progress ended at %d re-sealed, want %d", last, n)
		}
		// The old keyring is refused at start, saying which key and how many values.
		old, _ := secrets.NewSealer(fx.oldKey)
		err = secrets.CheckStore(ctx, st, old)
		if !errors.Is(err, secrets.ErrKeyMissing) || !strings.Contains(err.Error(), rot.NewKey) || !strings.Contains(err.Error(), fmt.Sprintf("%d secrets", n)) ||
			!strings.Contains(err.Error(), "2 agent CA keys") {
			t.Errorf("start with the old key: %v", err)
		}
		for _, plain := range fx.want {
			if strings.Contains(err.Error(), plain) {
				t.Errorf("the start check shows a secret: %v", err)
			}
		}
		// Again: a second rotation, from a keyed store.
		rot2, err := secrets.Rotate(ctx, secrets.RotateConfig{KeyFile: fx.keyFile, Store: st})
		if err != nil || rot2.NewKey == rot.NewKey || rot2.Resealed != n {
			t.Fatalf("second rotation: %+v %v", rot2, err)
		}
		fx.opensAll(t)
		fx.allUnder(t, rot2.NewKey)
	})
}

// A crash at any step of the rotation (the crash seam), the server started then opens every
// value, and rotate-key run again finishes the job: one key left, every value under it, the
// values unchanged. A crash after the new key was written keeps that key: the second run
// resumes with it.
func TestRotateCrashThenRerun(t *testing.T) {
	crash := errors.New("crash (test)")
	cases := []struct {
		step    string
		nth     int  // crash at the nth time the step is reached
		resumed bool // the second run finds the new key in the keyring
	}{
		{secrets.StepAddKey, 1, true},
		{"reseal-row", 1, true},
		{"reseal-row", 8, true}, // in the second batch: the first one committed
		{"reseal-batch", 1, true},
		{"reseal-batch", 4, true},
		{secrets.StepVerify, 1, true},
		{secrets.StepTrimRing, 1, true},
		{"stopped", 1, true}, // a server seen alive before the old key leaves
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s-%d", c.step, c.nth), func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				fx := newFixture(t, st, 17)
				seen := 0
				cfg := secrets.RotateConfig{KeyFile: fx.keyFile, Store: st, Batch: 5}
				if c.step == "stopped" {
					cfg.Stopped = func(context.Context) error { return crash }
				}
				crashed := false
				first, err := secrets.RotateCrashing(ctx, cfg, func(step string) error {
					// A crashed process does nothing more: every step after the crash (a write
					// function the store runs again, too) meets it.
					if crashed {
						return crash
					}
					if step == c.step {
						if seen++; seen == c.nth {
							crashed = true
							return crash
						}
					}
					return nil
				})
				if !errors.Is(err, crash) {
					t.Fatalf("first run: %v, want the crash", err)
				}
				fx.opensAll(t)
				second, err := secrets.Rotate(ctx, secrets.RotateConfig{KeyFile: fx.keyFile, Store: st, Batch: 5})
				if err != nil {
					t.Fatalf("second run: %v", err)
				}
				if second.Resumed != c.resumed || second.NewKey != first.NewKey {
					t.Errorf("second run %+v after first %+v", second, first)
				}
				ring, err := secrets.LoadKeyring(fx.keyFile)
				if err != nil || ring.Len() != 1 || ring.IDs()[0] != second.NewKey {
					t.Fatalf("key file: %v %v", ring, err)
				}
				fx.opensAll(t)
				fx.allUnder(t, second.NewKey)
			})
		})
	}
}

// A value that no key of the keyring opens stops the rotation before anything changed: the
// key file keeps its one key, and the error names the row, not the value.
func TestRotateRefusesAValueThatDoesNotOpen(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		fx := newFixture(t, st, 4)
		stranger, _ := secrets.NewSealer(bytes.Repeat([]byte{9}, secrets.KeySize))
		sealed, _ := stranger.Seal("zz", []byte("lost-password"))
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertSecret(ctx, "zz", "tenant", sealed) }); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(fx.keyFile)
		_, err := secrets.Rotate(ctx, secrets.RotateConfig{KeyFile: fx.keyFile, Store: st})
		if !errors.Is(err, secrets.ErrKeyMissing) || !strings.Contains(err.Error(), "zz") || !strings.Contains(err.Error(), "nothing was changed") || strings.Contains(err.Error(), "lost-password") {
			t.Fatalf("%v", err)
		}
		if after, _ := os.ReadFile(fx.keyFile); !bytes.Equal(before, after) {
			t.Error("the key file changed")
		}
		// The server's start check says the same of it.
		s, _ := secrets.NewSealer(fx.oldKey)
		if err := secrets.CheckStore(ctx, st, s); !errors.Is(err, secrets.ErrKeyMissing) || !strings.Contains(err.Error(), "1 secrets (zz among them)") {
			t.Errorf("start check: %v", err)
		}
	})
}

// The start check: legacy values under a key the keyring lacks are refused as such; a keyring
// holding the legacy key passes, wherever the key is in it.
func TestCheckStoreLegacy(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		fx := newFixture(t, st, 6)
		other := bytes.Repeat([]byte{8}, secrets.KeySize)
		wrong, _ := secrets.NewSealer(other)
		err := secrets.CheckStore(ctx, st, wrong)
		if !errors.Is(err, secrets.ErrKeyMissing) || !strings.Contains(err.Error(), "3 secrets") || !strings.Contains(err.Error(), "before sealing keyrings") {
			t.Errorf("%v", err)
		}
		ring, _ := secrets.NewKeyring(other, fx.oldKey)
		s, _ := secrets.NewKeyringSealer(ring)
		if err := secrets.CheckStore(ctx, st, s); err != nil {
			t.Errorf("keyring holding the key second: %v", err)
		}
	})
}

// A legacy value whose random nonce starts with the magic (once in 2^32) looks keyed, under a
// key no keyring holds: the start check opens it rather than refusing the keyring, and the
// rotation re-seals it.
func TestLegacyValueLookingKeyed(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		fx := newFixture(t, st, 2)
		block, _ := aes.NewCipher(fx.oldKey)
		aead, _ := cipher.NewGCM(block)
		nonce := append([]byte(secrets.Magic), 1, 2, 3, 4, 5, 6, 7, 8)
		sealed := aead.Seal(append([]byte(nil), nonce...), nonce, []byte("pw-lookalike"), []byte("look"))
		if secrets.KeyIDOf(sealed) != "0102030405060708" {
			t.Fatalf("not a lookalike: %x", sealed)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertSecret(ctx, "look", "tenant", sealed) }); err != nil {
			t.Fatal(err)
		}
		fx.want["look"] = "pw-lookalike"
		fx.opensAll(t)
		rot, err := secrets.Rotate(ctx, secrets.RotateConfig{KeyFile: fx.keyFile, Store: st})
		if err != nil || rot.Resealed != 3 {
			t.Fatalf("%+v %v", rot, err)
		}
		fx.opensAll(t)
		fx.allUnder(t, rot.NewKey)
	})
}
