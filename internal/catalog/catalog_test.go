package catalog

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
)

func TestVerify(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	otherPub, otherKey, _ := ed25519.GenerateKey(nil)
	img := Image{Name: "debian-12", URL: "http://10.0.0.1/debian.raw.zst", Size: 1 << 30, Format: "raw", Compression: "zstd", SHA256: strings.Repeat("a", 64), Signer: "lab"}
	img.Signature = Sign(img, key)
	signers := []Signer{{Name: "lab", PublicKey: pub}, {Name: "old", PublicKey: otherPub, Revoked: true}}
	if err := Verify(img, signers); err != nil {
		t.Fatal(err)
	}
	tamper := map[string]func(*Image){
		"name":        func(i *Image) { i.Name = "debian-13" },
		"url":         func(i *Image) { i.URL = "http://evil/debian.raw.zst" },
		"size":        func(i *Image) { i.Size++ },
		"format":      func(i *Image) { i.Format = "qcow2" },
		"compression": func(i *Image) { i.Compression = "xz" },
		"sha256":      func(i *Image) { i.SHA256 = strings.Repeat("b", 64) },
		"sha512":      func(i *Image) { i.SHA512 = strings.Repeat("c", 128) },
		"signature":   func(i *Image) { i.Signature = append([]byte{}, i.Signature...); i.Signature[0] ^= 1 },
	}
	for field, f := range tamper {
		bad := img
		f(&bad)
		if err := Verify(bad, signers); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s changed: %v, want ErrBadSignature", field, err)
		}
	}
	unsigned := img
	unsigned.Signature = nil
	revoked := img
	revoked.Signer, revoked.Signature = "old", Sign(img, otherKey)
	unknown := img
	unknown.Signer = "nobody"
	for name, c := range map[string]struct {
		img  Image
		want error
	}{"unsigned": {unsigned, ErrUnsigned}, "revoked signer": {revoked, ErrRevoked}, "unknown signer": {unknown, ErrUnknownSigner}} {
		if err := Verify(c.img, signers); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	for _, bad := range []func(*Image){
		func(i *Image) { i.URL = "ftp://x/y" }, func(i *Image) { i.Format = "vmdk" }, func(i *Image) { i.Compression = "bz2" },
		func(i *Image) { i.SHA256 = "" }, func(i *Image) { i.SHA256 = "ABC" }, func(i *Image) { i.Size = -1 },
		func(i *Image) { i.Format = "iso" }, // compressed: an ISO is booted as it is
		func(i *Image) {
			i.Format, i.Compression, i.SHA256, i.SHA512 = "iso", "none", "", strings.Repeat("c", 128)
		},
		func(i *Image) { i.Format = FormatFirmware }, // compressed: the BMC takes it as it is
		func(i *Image) {
			i.Format, i.Compression, i.SHA256, i.SHA512 = FormatFirmware, "none", "", strings.Repeat("c", 128)
		},
	} {
		b := img
		bad(&b)
		if err := Check(b); err == nil {
			t.Errorf("%+v accepted", b)
		}
	}
	iso := img
	iso.Format, iso.Compression = "iso", "none"
	if err := Check(iso); err != nil {
		t.Errorf("an uncompressed ISO with a sha256: %v", err)
	}
	fw := img
	fw.Format, fw.Compression = FormatFirmware, "none"
	if err := Check(fw); err != nil {
		t.Errorf("an uncompressed firmware image with a sha256: %v", err)
	}
}

func TestSigningInputIsUnambiguous(t *testing.T) {
	a := Image{Name: "ab", URL: "c"}
	b := Image{Name: "a", URL: "bc"}
	if string(SigningInput(a)) == string(SigningInput(b)) {
		t.Fatal("field boundaries are ambiguous")
	}
}

// A remembered signature spares only the Ed25519 verification of the same key, input and
// signature: a changed field, signature or key, a signer revoked or removed since, are refused
// as without the memo, and a signature that failed is not remembered.
func TestVerifyRememberingRefusesAsVerify(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	otherPub, _, _ := ed25519.GenerateKey(nil)
	img := Image{Name: "debian-12", URL: "http://10.0.0.1/debian.raw.zst", Size: 1 << 30, Format: "raw", Compression: "zstd", SHA256: strings.Repeat("a", 64), Signer: "lab"}
	img.Signature = Sign(img, key)
	signers := []Signer{{Name: "lab", PublicKey: pub}}
	seen := NewVerifiedSignatures()
	for range 2 {
		if err := VerifyRemembering(img, signers, seen); err != nil {
			t.Fatal(err)
		}
	}
	if n := seen.Len(); n != 1 {
		t.Fatalf("remembered %d signatures, want 1", n)
	}
	flipped := img
	flipped.Signature = append([]byte{}, img.Signature...)
	flipped.Signature[5] ^= 1
	moved := img
	moved.URL = "http://10.0.0.2/debian.raw.zst"
	for name, c := range map[string]struct {
		img     Image
		signers []Signer
		want    error
	}{
		"a field changed":       {moved, signers, ErrBadSignature},
		"the signature changed": {flipped, signers, ErrBadSignature},
		"the signer's new key":  {img, []Signer{{Name: "lab", PublicKey: otherPub}}, ErrBadSignature},
		"the signer revoked":    {img, []Signer{{Name: "lab", PublicKey: pub, Revoked: true}}, ErrRevoked},
		"the signer removed":    {img, nil, ErrUnknownSigner},
	} {
		for range 2 {
			if err := VerifyRemembering(c.img, c.signers, seen); !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", name, err, c.want)
			}
		}
	}
	if n := seen.Len(); n != 1 {
		t.Errorf("remembered %d signatures after the refusals, want still 1", n)
	}
	if err := VerifyRemembering(img, signers, nil); err != nil {
		t.Errorf("without a memo: %v", err)
	}
}
