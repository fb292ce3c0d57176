// Package catalog is the image catalog's trust rule: an image is deployable only when an
// Ed25519 signature by a registered, unrevoked signer covers every field that decides which
// bytes end up on a disk (name, URL, size, format, compression, digests). Pure functions, and a
// memo of the signatures that verified (VerifiedSignatures).
package catalog

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"

	"bcd/internal/cache"
)

// Image is a catalog entry.
type Image struct {
	Name        string
	URL         string
	Size        int64
	Format      string // raw | qcow2 | iso | firmware
	Compression string // none | zstd | xz | gzip
	SHA256      string // hex
	SHA512      string // hex
	Signer      string
	Signature   []byte
}

// Signer is a registered public key.
type Signer struct {
	Name      string
	PublicKey ed25519.PublicKey
	Revoked   bool
}

// Formats and compressions accepted.
var (
	formats      = []string{"raw", "qcow2", "iso", FormatFirmware}
	compressions = []string{"none", "zstd", "xz", "gzip"}
	hex64        = regexp.MustCompile(`^[0-9a-f]{64}$`)
	hex128       = regexp.MustCompile(`^[0-9a-f]{128}$`)
)

// FormatFirmware is a firmware package a BMC installs (a pool's firmwareImages): never written
// to a disk or booted.
const FormatFirmware = "firmware"

// Check validates an image's fields (not its signature). A URL may not carry a user or password:
// the catalog shows its URLs to every viewer. A URL signed with a query token is accepted; the
// token is redacted where bcd shows the URL beyond the catalog (events, the ramdisk's logs).
func Check(img Image) error {
	u, err := url.Parse(img.URL)
	switch {
	case err != nil:
		// Not quoted: what does not parse may be a password or a token.
		return fmt.Errorf("image %s: the URL does not parse: use http(s)://host/path", img.Name)
	case u.User != nil:
		return fmt.Errorf("image %s: the URL must not carry a user or password (USER:PASSWORD@HOST): catalog URLs are shown to every viewer; serve the image where sites fetch it without credentials, or sign the URL with a query token", img.Name)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("image %s: URL %q: use http(s)://host/path", img.Name, RedactURL(img.URL))
	}
	if img.Size < 0 {
		return fmt.Errorf("image %s: size %d is negative", img.Name, img.Size)
	}
	if !slices.Contains(formats, img.Format) {
		return fmt.Errorf("image %s: format %q: accepted are raw, qcow2, iso, firmware", img.Name, img.Format)
	}
	if img.Format == FormatFirmware && img.Compression != "none" {
		return fmt.Errorf("image %s: a firmware image is handed to the BMC as it is: compression must be none", img.Name)
	}
	if img.Format == FormatFirmware && img.SHA256 == "" {
		return fmt.Errorf("image %s: a firmware image needs a sha256 (the site serves it only once it matched)", img.Name)
	}
	if img.Format == "iso" && img.Compression != "none" {
		return fmt.Errorf("image %s: an iso is booted as it is (virtual media, iPXE sanboot): compression must be none", img.Name)
	}
	if img.Format == "iso" && img.SHA256 == "" {
		return fmt.Errorf("image %s: an iso needs a sha256 (the site serves it only once it matched)", img.Name)
	}
	if !slices.Contains(compressions, img.Compression) {
		return fmt.Errorf("image %s: compression %q: accepted are none, zstd, xz, gzip", img.Name, img.Compression)
	}
	if img.SHA256 == "" && img.SHA512 == "" {
		return fmt.Errorf("image %s: a sha256 or sha512 digest is required", img.Name)
	}
	if img.SHA256 != "" && !hex64.MatchString(img.SHA256) {
		return fmt.Errorf("image %s: sha256 must be 64 lower-case hex digits", img.Name)
	}
	if img.SHA512 != "" && !hex128.MatchString(img.SHA512) {
		return fmt.Errorf("image %s: sha512 must be 128 lower-case hex digits", img.Name)
	}
	return nil
}

// RedactURL is an image URL as events and logs show it: scheme, host and path; a user or
// password dropped, a query (a signed URL's token) replaced by "[redacted]".
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "[unparseable URL]"
	}
	out := u.Scheme + "://" + u.Host + u.EscapedPath()
	if u.RawQuery != "" || u.ForceQuery {
		out += "?[redacted]"
	}
	return out
}

// SigningInput is the unambiguous byte string a signer signs: a domain separator, then every
// field length-prefixed.
func SigningInput(img Image) []byte {
	out := []byte("bcd-image-v1\x00")
	add := func(s string) {
		out = binary.BigEndian.AppendUint32(out, uint32(len(s)))
		out = append(out, s...)
	}
	add(img.Name)
	add(img.URL)
	out = binary.BigEndian.AppendUint64(out, uint64(img.Size))
	add(img.Format)
	add(img.Compression)
	add(img.SHA256)
	add(img.SHA512)
	return out
}

// Sign signs img with key.
func Sign(img Image, key ed25519.PrivateKey) []byte { return ed25519.Sign(key, SigningInput(img)) }

// Refusals.
var (
	ErrUnsigned      = errors.New("image is not signed")
	ErrUnknownSigner = errors.New("image is signed by an unknown signer")
	ErrRevoked       = errors.New("image's signer is revoked")
	ErrBadSignature  = errors.New("image's signature does not verify: a field was changed after signing, or the signature is forged")
)

// Verify decides whether img may be deployed, given the registered signers.
func Verify(img Image, signers []Signer) error { return VerifyRemembering(img, signers, nil) }

// maxVerifiedSignatures bounds the image signatures a VerifiedSignatures remembers (one per
// image in use, and one more each time an image or its signer's key is replaced).
const maxVerifiedSignatures = 1 << 12

// VerifiedSignatures remembers the image signatures that verified, by signer's public key,
// signing input and signature (cache.Verified). Every deploy step checks its image again (a
// revoked signer or a changed row refuses the deploy), in the store's single writer; this
// spares it the Ed25519 verification of an image it already verified.
type VerifiedSignatures = cache.Verified

// NewVerifiedSignatures returns an empty VerifiedSignatures.
func NewVerifiedSignatures() *VerifiedSignatures { return cache.NewVerified(maxVerifiedSignatures) }

// VerifyRemembering is Verify that skips the Ed25519 verification of a signature seen
// verifying before (nil: none is remembered). The checks before it (the image's fields, a
// signature present, its signer registered and not revoked) run every time.
func VerifyRemembering(img Image, signers []Signer, seen *VerifiedSignatures) error {
	if err := Check(img); err != nil {
		return err
	}
	if img.Signer == "" || len(img.Signature) == 0 {
		return fmt.Errorf("%s: %w", img.Name, ErrUnsigned)
	}
	i := slices.IndexFunc(signers, func(s Signer) bool { return s.Name == img.Signer })
	if i < 0 {
		return fmt.Errorf("%s (signer %s): %w", img.Name, img.Signer, ErrUnknownSigner)
	}
	s := signers[i]
	if s.Revoked {
		return fmt.Errorf("%s (signer %s): %w", img.Name, img.Signer, ErrRevoked)
	}
	in := SigningInput(img)
	verify := func() bool { return ed25519.Verify(s.PublicKey, in, img.Signature) }
	if len(s.PublicKey) != ed25519.PublicKeySize || !seen.Check(verify, s.PublicKey, in, img.Signature) {
		return fmt.Errorf("%s (signer %s): %w", img.Name, img.Signer, ErrBadSignature)
	}
	return nil
}
