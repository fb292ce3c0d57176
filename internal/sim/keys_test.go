package sim

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"testing"
)

// Keys made ahead are each taken once, as made: every request is signed by its own key (a key
// that signs and verifies under the request's public key), no key twice; once the stock is
// spent a boot makes its own through the gate. A cancelled making adds nothing.
func TestKeysMadeAheadAreTakenOnceEach(t *testing.T) {
	ctx := context.Background()
	link := &gatedLink{}
	s := New(Config{}, link)
	const n = 5
	if err := s.MakeKeys(ctx, n); err != nil {
		t.Fatal(err)
	}
	if got := s.keys.left(); got != n {
		t.Fatalf("%d keys left after making %d", got, n)
	}
	seen := map[string]bool{}
	for i := range n + 1 {
		key, csrDER, err := s.keyAndCSR(ctx, "ramdisk-n1")
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(max(0, i-n+1)); link.through.Load() != want {
			t.Fatalf("boot %d: %d through the gate, want %d (the stock has %d)", i, link.through.Load(), want, n)
		}
		csr, err := x509.ParseCertificateRequest(csrDER)
		if err != nil {
			t.Fatalf("boot %d: %v", i, err)
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("boot %d: request's signature: %v", i, err)
		}
		pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
		if !ok || !pub.Equal(key.Public()) {
			t.Fatalf("boot %d: the request is not for the key handed out with it", i)
		}
		digest := sha256.Sum256([]byte("statement"))
		sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
		if err != nil || !ecdsa.VerifyASN1(pub, digest[:], sig) {
			t.Fatalf("boot %d: the key does not sign for its public key: %v", i, err)
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		if seen[string(der)] {
			t.Fatalf("boot %d: a key handed out twice", i)
		}
		seen[string(der)] = true
	}
	if got := s.keys.left(); got != 0 {
		t.Fatalf("%d keys left, want none", got)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.MakeKeys(cancelled, 3); !errors.Is(err, context.Canceled) {
		t.Fatalf("making keys with the context ended: %v, want its error", err)
	}
	if got := s.keys.left(); got != 0 {
		t.Fatalf("%d keys left after a cancelled making, want none", got)
	}
}

// Keys made in two goes are all taken, the second go's after the first's left-overs.
func TestKeysMadeAheadInTwoGoes(t *testing.T) {
	ctx := context.Background()
	s := New(Config{}, &gatedLink{})
	for _, n := range []int{3, 4} {
		if err := s.MakeKeys(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.keyAndCSR(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if got := s.keys.left(); got != 6 {
		t.Fatalf("%d keys left, want 6", got)
	}
	for range 6 {
		key, csrDER, ok := s.keys.take()
		if !ok {
			t.Fatal("the stock ran out early")
		}
		csr, err := x509.ParseCertificateRequest(csrDER)
		if err != nil || !csr.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
			t.Fatalf("a key and request that do not match: %v", err)
		}
	}
	if _, _, ok := s.keys.take(); ok {
		t.Fatal("a key taken from an empty stock")
	}
}
