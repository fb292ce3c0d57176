package sim

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
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

// A presigned signature is an ECDSA signature the standard verifier accepts for the signing key
// and the digest, and no other; each presignature signs once (its nonce never twice: two
// signatures never share r); a spent stock, or a key that is not P-256 ECDSA, signs nothing
// (the caller signs as usual).
func TestPresignaturesSignOnceEach(t *testing.T) {
	ctx := context.Background()
	s := New(Config{}, &gatedLink{})
	const n = 4
	if err := s.MakePresignatures(ctx, n); err != nil {
		t.Fatal(err)
	}
	key, _, err := pki.NewKeyAndCSR("m")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := pki.NewKeyAndCSR("other")
	if err != nil {
		t.Fatal(err)
	}
	rs := map[string]bool{}
	for i := range n {
		digest := sha256.Sum256([]byte{byte(i)})
		sig, ok := s.presigs.sign(key, digest[:])
		if !ok {
			t.Fatalf("signature %d: none made with %d presignatures left", i, s.presigs.left())
		}
		pub := key.Public().(*ecdsa.PublicKey)
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			t.Fatalf("signature %d does not verify", i)
		}
		wrong := sha256.Sum256([]byte("another statement"))
		if ecdsa.VerifyASN1(pub, wrong[:], sig) || ecdsa.VerifyASN1(other.Public().(*ecdsa.PublicKey), digest[:], sig) {
			t.Fatalf("signature %d verifies for another digest or key", i)
		}
		var rsig struct{ R, S *big.Int }
		if _, err := asn1.Unmarshal(sig, &rsig); err != nil {
			t.Fatal(err)
		}
		if rs[rsig.R.String()] {
			t.Fatalf("signature %d reuses a nonce", i)
		}
		rs[rsig.R.String()] = true
	}
	digest := sha256.Sum256([]byte("x"))
	if _, ok := s.presigs.sign(key, digest[:]); ok {
		t.Fatal("signed with the stock spent")
	}
	if err := s.MakePresignatures(ctx, 1); err != nil {
		t.Fatal(err)
	}
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	if _, ok := s.presigs.sign(ed, digest[:]); ok || s.presigs.left() != 1 {
		t.Fatalf("an Ed25519 key signed (or took a presignature: %d left)", s.presigs.left())
	}
}

// A simulated machine's signed result verifies as the server checks it (pki.VerifyStatement)
// whether a presignature signed it or its key did once the stock was spent.
func TestSignedResultsVerifyWithAndWithoutPresignatures(t *testing.T) {
	ctx := context.Background()
	ca, err := pki.CreateCA("sim test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{}, &gatedLink{})
	if err := s.MakePresignatures(ctx, 1); err != nil {
		t.Fatal(err)
	}
	key, csr, err := pki.NewKeyAndCSR("m")
	if err != nil {
		t.Fatal(err)
	}
	node := "01a25054-0654-706d-8f27-871039729957"
	cert, err := ca.IssueNode(csr, node, 3, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := &ramdisk{s: s, key: key, cert: cert, gen: 3}
	for i := range 2 {
		c := store.Command{ID: fmt.Sprintf("cmd-%d", i), NodeID: node, Kind: "disk.wipe", Generation: 3}
		u := r.signed(ctx, c, map[string]any{"disks": []any{}})
		if u.State != "succeeded" || len(u.NodeSig) == 0 {
			t.Fatalf("result %d: %+v", i, u)
		}
		st := pki.Statement{CommandID: c.ID, NodeID: node, Kind: c.Kind, Generation: 3, ResultSHA256: pki.ResultDigest(u.Result)}
		if err := pki.VerifyStatement(ca, u.SignerCertDER, st, u.NodeSig, 3, time.Now()); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
		if got := s.presigs.left(); got != 0 {
			t.Fatalf("after result %d: %d presignatures left, want none", i, got)
		}
	}
}
