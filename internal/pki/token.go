package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"fmt"
)

// Token prefixes: they make a leaked token recognisable (secret scanners, logs) and say what it
// opens. They are part of the token and of its hash.
const (
	JoinTokenPrefix      = "bcdj_" // site agent bootstrap
	DiscoveryTokenPrefix = "bcdd_" // one-time ramdisk token in a boot entry
	InstanceTokenPrefix  = "bcdi_" // deployed OS rejoin
	APITokenPrefix       = "bcda_" // API bearer token
)

// tokenBytes is the token's entropy: 256 bits.
const tokenBytes = 32

// tokenEncoding is lower-case base32 without padding: no punctuation to break copy-paste.
func tokenEncoding() *base32.Encoding {
	return base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
}

// NewToken makes a bearer token: prefix followed by 32 random bytes in lower-case base32
// (52 characters). It returns the plain token, shown once to its user, and its hash, the only
// thing to store. prefix is 1 to 16 characters of [a-z0-9_].
func NewToken(prefix string) (plain string, hash []byte, err error) {
	if err := validatePrefix(prefix); err != nil {
		return "", nil, fmt.Errorf("making token: %w", err)
	}
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("making token: %w", err)
	}
	plain = prefix + tokenEncoding().EncodeToString(b)
	return plain, HashToken(plain), nil
}

func validatePrefix(p string) error {
	if p == "" || len(p) > 16 {
		return fmt.Errorf("%w: token prefix must be 1 to 16 characters", ErrBadInput)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("%w: token prefix %q has character %q: allowed are a-z, 0-9, '_'", ErrBadInput, p, c)
		}
	}
	return nil
}

// HashToken is the SHA-256 of the whole token (prefix included). A token has 256 bits of
// entropy, so a fast hash is enough: no password-style stretching is needed.
func HashToken(plain string) []byte {
	sum := sha256.Sum256([]byte(plain))
	return sum[:]
}

// TokenMatches reports whether plain hashes to hash, in time independent of where they differ.
func TokenMatches(plain string, hash []byte) bool {
	if len(hash) != sha256.Size {
		return false
	}
	return subtle.ConstantTimeCompare(HashToken(plain), hash) == 1
}
