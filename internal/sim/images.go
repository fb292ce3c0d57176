package sim

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"bcd/internal/auth"
	"bcd/internal/catalog"
	"bcd/internal/metal"
	"bcd/internal/store"
)

// SeedImages registers a signer "sim" (once) and adds each named image to the catalog, signed by
// it, so simulated deploys pass the catalog's signature check.
func SeedImages(ctx context.Context, svc *metal.Service, admin auth.Principal, names ...string) error {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	signer := "sim-" + hex.EncodeToString(pub[:4])
	if err := svc.AddSigner(ctx, admin, signer, pub); err != nil && !errors.Is(err, store.ErrConflict) {
		return err
	}
	for _, name := range names {
		if err := svc.AddImage(ctx, admin, Image(name, signer, key)); err != nil {
			return err
		}
	}
	return nil
}

// Image is the simulated image name (the simulated ramdisks never fetch it), signed by signer
// with key.
func Image(name, signer string, key ed25519.PrivateKey) catalog.Image {
	sum := sha256.Sum256([]byte(name))
	img := catalog.Image{Name: name, URL: "http://images.sim/" + name + ".raw.zst", Size: 1 << 30, Format: "raw", Compression: "zstd",
		SHA256: hex.EncodeToString(sum[:]), Signer: signer}
	img.Signature = catalog.Sign(img, key)
	return img
}
