package sim

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"errors"
	"fmt"
	"math/big"
	"runtime"
	"sync"
	"sync/atomic"

	"bcd/internal/pki"
)

// keyStock holds simulated machines' keys and certificate requests made ahead (Sim.MakeKeys),
// each taken once. They are packed in one buffer without pointers, which the collector never
// scans: as ecdsa.PrivateKey values, ten thousand of them doubled the collector's work in a
// 10 000-node run (its live heap grew by 16 MiB).
type keyStock struct {
	mu sync.Mutex
	// buf holds the records one after the other, and ends the offset where each begins: the
	// private scalar, the public point's two coordinates (keyScalar bytes each), then the
	// request's DER.
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
	key := &ecdsa.PrivateKey{
		PublicKey: ecdsa.PublicKey{Curve: elliptic.P256(), X: new(big.Int).SetBytes(rec[keyScalar : 2*keyScalar]), Y: new(big.Int).SetBytes(rec[2*keyScalar : 3*keyScalar])},
		D:         new(big.Int).SetBytes(rec[:keyScalar]),
	}
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
	var next atomic.Int64
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), n)
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				key, csr, err := pki.NewKeyAndCSR("sim-machine")
				if err == nil {
					recs[i], err = packKey(key, csr)
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
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
