package sim

import (
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"
	"runtime"
	"sync"

	"bcd/internal/pki"
)

// keyStock holds simulated machines' keys and certificate requests made ahead (Sim.MakeKeys),
// each taken once. They are packed in one buffer without pointers, which the collector never
// scans: as ecdsa.PrivateKey values, ten thousand of them doubled the collector's work in a
// 10 000-node run (its live heap grew by 16 MiB).
type keyStock struct {
	mu sync.Mutex
	// buf holds the records one after the other, ends the offset just past each: the private
	// scalar, the public point's two coordinates (keyScalar bytes each), then the request's
	// DER.
	buf  []byte
	ends []uint32
}

// keyScalar is the size of a P-256 scalar or coordinate.
const keyScalar = 32

// put packs a key and its request.
func (k *keyStock) put(rec []byte) {
	k.buf = append(k.buf, rec...)
	k.ends = append(k.ends, uint32(len(k.buf)))
}

// take unpacks the last key left (false: none).
func (k *keyStock) take() (crypto.Signer, []byte, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.ends)
	if n == 0 {
		return nil, nil, false
	}
	start := uint32(0)
	if n > 1 {
		start = k.ends[n-2]
	}
	rec := k.buf[start:k.ends[n-1]]
	x, y := new(big.Int).SetBytes(rec[keyScalar:2*keyScalar]), new(big.Int).SetBytes(rec[2*keyScalar:3*keyScalar])
	key := &ecdsa.PrivateKey{PublicKey: ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}, D: new(big.Int).SetBytes(rec[:keyScalar])}
	csr := append([]byte(nil), rec[3*keyScalar:]...)
	k.buf, k.ends = k.buf[:start], k.ends[:n-1]
	if n == 1 {
		k.buf, k.ends = nil, nil // (the stock's memory goes with its last key)
	}
	return key, csr, true
}

// left counts the keys not taken yet.
func (k *keyStock) left() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.ends)
}

// packKey is key and its request csr as keyStock records them.
func packKey(key crypto.Signer, csr []byte) ([]byte, error) {
	ek, ok := key.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("packing a simulated machine's key: %T is not an ECDSA P-256 key", key)
	}
	rec := make([]byte, 3*keyScalar, 3*keyScalar+len(csr))
	ek.D.FillBytes(rec[:keyScalar])
	ek.X.FillBytes(rec[keyScalar : 2*keyScalar])
	ek.Y.FillBytes(rec[2*keyScalar : 3*keyScalar])
	return append(rec, csr...), nil
}

// MakeKeys makes n keys and certificate requests ahead, on every processor, for the simulated
// machines' next boots (their ramdisks' and installed systems') to take, one each, instead of
// making their own as they boot: a fleet's machines make their keys on their own processors,
// which the simulation would otherwise take from the server's while a phase is timed. Boots
// once the stock is spent make their own, as before. The requests' common name is
// "sim-machine" (informative only).
func (s *Sim) MakeKeys(ctx context.Context, n int) error {
	if n <= 0 {
		return nil
	}
	recs := make([][]byte, n)
	err := eachOn(ctx, runtime.GOMAXPROCS(0), n, func(_ context.Context, i int) error {
		key, csr, err := pki.NewKeyAndCSR("sim-machine")
		if err == nil {
			recs[i], err = packKey(key, csr)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("making %d simulated machines' keys ahead: %w", n, err)
	}
	size := 0
	for _, r := range recs {
		size += len(r)
	}
	s.keys.mu.Lock()
	defer s.keys.mu.Unlock()
	s.keys.buf = append(make([]byte, 0, len(s.keys.buf)+size), s.keys.buf...)
	for _, r := range recs {
		s.keys.put(r)
	}
	return nil
}

// MakePresignatures makes n presignatures ahead (presigStock) for the simulated machines'
// next signed results to take, one each, instead of computing k·G as they sign: a fleet's
// machines sign on their own processors. Results once the stock is spent are signed as before.
// Machines that reach the server over its gateway sign as the real agent does (agentlink),
// with none: none is made for them.
func (s *Sim) MakePresignatures(ctx context.Context, n int) error {
	if s.cfg.Gateway != nil {
		return nil
	}
	return s.presigs.make(ctx, n)
}

// presigStock holds ECDSA P-256 presignatures made ahead (Sim.MakePresignatures): for a
// random nonce k, r (the x coordinate of k·G, mod the group's order n) and k⁻¹ mod n, each
// used once. Neither depends on the key that signs: with them a simulated machine's signature
// over a digest e by its key d is s = k⁻¹(e + r·d) mod n, two multiplications, where Go's
// signing computes k·G then (most of its 40–50 µs here). The result is an ordinary ECDSA
// signature, which the server verifies as any other. Packed without pointers, as the keys.
type presigStock struct {
	mu  sync.Mutex
	buf []byte // records of presigSize bytes: r, then k⁻¹
}

const presigSize = 2 * keyScalar

// p256Order is the order of P-256's group, n.
var p256Order = elliptic.P256().Params().N

// makePresig makes one presignature record.
func makePresig() ([]byte, error) {
	for {
		k, err := ecdh.P256().GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("making a presignature: %w", err)
		}
		kb := k.Bytes()
		point := k.PublicKey().Bytes() // 0x04 ‖ x ‖ y
		r := new(big.Int).SetBytes(point[1 : 1+keyScalar])
		r.Mod(r, p256Order)
		kInv := new(big.Int).ModInverse(new(big.Int).SetBytes(kb), p256Order)
		if r.Sign() == 0 || kInv == nil {
			continue // (negligible: another nonce)
		}
		rec := make([]byte, presigSize)
		r.FillBytes(rec[:keyScalar])
		kInv.FillBytes(rec[keyScalar:])
		return rec, nil
	}
}

// sign signs digest (a SHA-256) with key by a presignature taken from the stock, ASN.1 encoded
// as crypto/ecdsa's signatures are; false, taking none, when none is left or the key is not an
// ECDSA P-256 key. (math/big is not constant-time: the simulation's keys only.)
func (p *presigStock) sign(key crypto.Signer, digest []byte) ([]byte, bool) {
	ek, ok := key.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() || len(digest) != keyScalar {
		return nil, false
	}
	p.mu.Lock()
	n := len(p.buf)
	if n < presigSize {
		p.mu.Unlock()
		return nil, false
	}
	rec := p.buf[n-presigSize : n]
	r := new(big.Int).SetBytes(rec[:keyScalar])
	kInv := new(big.Int).SetBytes(rec[keyScalar:])
	clear(rec)
	p.buf = p.buf[:n-presigSize]
	p.mu.Unlock()
	s := new(big.Int).Mul(r, ek.D)
	s.Add(s, new(big.Int).SetBytes(digest))
	s.Mul(s, kInv)
	s.Mod(s, p256Order)
	if s.Sign() == 0 {
		return nil, false // (negligible: the caller signs as usual)
	}
	sig, err := asn1.Marshal(struct{ R, S *big.Int }{r, s})
	if err != nil {
		return nil, false
	}
	return sig, true
}

// presigner is key signing with presignatures from stock (presigStock.sign), for pki's signing
// functions to take in its place: errNoPresignature when none is left (or key takes none).
type presigner struct {
	key   crypto.Signer
	stock *presigStock
}

// errNoPresignature: a presigner had none to sign with.
var errNoPresignature = errors.New("no presignature left")

func (p presigner) Public() crypto.PublicKey { return p.key.Public() }

func (p presigner) Sign(_ io.Reader, digest []byte, _ crypto.SignerOpts) ([]byte, error) {
	if sig, ok := p.stock.sign(p.key, digest); ok {
		return sig, nil
	}
	return nil, errNoPresignature
}

// left counts the presignatures not used yet.
func (p *presigStock) left() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.buf) / presigSize
}

// make adds n presignatures to the stock, on every processor.
func (p *presigStock) make(ctx context.Context, n int) error {
	if n <= 0 {
		return nil
	}
	recs := make([][]byte, n)
	err := eachOn(ctx, runtime.GOMAXPROCS(0), n, func(_ context.Context, i int) (err error) {
		recs[i], err = makePresig()
		return err
	})
	if err != nil {
		return fmt.Errorf("making %d presignatures: %w", n, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(make([]byte, 0, len(p.buf)+n*presigSize), p.buf...)
	for _, r := range recs {
		p.buf = append(p.buf, r...)
	}
	return nil
}
