package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

const bmcPassword = "Sup3r-Secret-BMC-pa55word!"

func TestJWERoundTrip(t *testing.T) {
	ca := newCA(t)
	for _, id := range []Identity{SiteAgentIdentity("s1", "a1"), NodeIdentity("n1", 2)} {
		agent := issue(t, ca, id, time.Hour)
		for _, plain := range []string{"", "x", bmcPassword, strings.Repeat("p", 4096)} {
			compact, err := EncryptToAgent(agent.cert, []byte(plain))
			if err != nil {
				t.Fatalf("%s: EncryptToAgent: %v", id, err)
			}
			if len(plain) >= 8 && strings.Contains(compact, plain) {
				t.Fatalf("%s: plaintext visible in the JWE", id)
			}
			if parts := strings.Split(compact, "."); len(parts) != 5 {
				t.Fatalf("%s: compact JWE has %d parts", id, len(parts))
			}
			got, err := DecryptAsAgent(agent.key, compact)
			if err != nil {
				t.Fatalf("%s: DecryptAsAgent: %v", id, err)
			}
			if string(got) != plain {
				t.Fatalf("%s: round trip = %q, want %q", id, got, plain)
			}
		}
	}
}

func TestJWEIsRandomized(t *testing.T) {
	ca := newCA(t)
	agent := issue(t, ca, SiteAgentIdentity("s1", "a1"), time.Hour)
	a, _ := EncryptToAgent(agent.cert, []byte(bmcPassword))
	b, _ := EncryptToAgent(agent.cert, []byte(bmcPassword))
	if a == b {
		t.Fatal("two encryptions of the same secret are identical")
	}
}

func TestEncryptToAgentRefusesRecipients(t *testing.T) {
	ca := newCA(t)
	tests := []struct {
		name string
		cert []byte
		want error
	}{
		{"node tenant", issue(t, ca, NodeTenantIdentity("n1", "acme", 1), time.Hour).cert, ErrNotRecipient},
		{"server", issue(t, ca, ServerIdentity(), time.Hour).cert, ErrNotRecipient},
		{"CA certificate (no identity)", ca.Certificate().Raw, ErrBadIdentity},
		{"garbage", []byte("junk"), ErrCertInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			compact, err := EncryptToAgent(tt.cert, []byte(bmcPassword))
			wantErr(t, err, tt.want)
			if compact != "" {
				t.Fatal("JWE returned with an error")
			}
			if strings.Contains(err.Error(), bmcPassword) {
				t.Fatalf("error shows the secret: %v", err)
			}
		})
	}
}

// flipPart flips one bit in the middle of part i of a compact JWE.
func flipPart(t *testing.T, compact string, i int) string {
	t.Helper()
	parts := strings.Split(compact, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[i])
	if err != nil || len(b) == 0 {
		t.Fatalf("part %d: %v", i, err)
	}
	b[len(b)/2] ^= 0x01
	parts[i] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

func TestDecryptAsAgentRefuses(t *testing.T) {
	ca := newCA(t)
	agent := issue(t, ca, SiteAgentIdentity("s1", "a1"), time.Hour)
	otherAgent := issue(t, ca, SiteAgentIdentity("s1", "a2"), time.Hour)
	compact, err := EncryptToAgent(agent.cert, []byte(bmcPassword))
	if err != nil {
		t.Fatal(err)
	}
	pub := agent.key.Public().(*ecdsa.PublicKey)
	otherAlg := func(alg jose.KeyAlgorithm, enc jose.ContentEncryption) string {
		e, err := jose.NewEncrypter(enc, jose.Recipient{Algorithm: alg, Key: pub}, nil)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := e.Encrypt([]byte(bmcPassword))
		if err != nil {
			t.Fatal(err)
		}
		s, err := obj.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	parts := strings.Split(compact, ".")
	tests := []struct {
		name    string
		compact string
		want    error
	}{
		{"tampered header", flipPart(t, compact, 0), ErrDecrypt},
		{"tampered encrypted key", flipPart(t, compact, 1), ErrDecrypt},
		{"tampered IV", flipPart(t, compact, 2), ErrDecrypt},
		{"tampered ciphertext", flipPart(t, compact, 3), ErrDecrypt},
		{"tampered tag", flipPart(t, compact, 4), ErrDecrypt},
		{"truncated", compact[:len(compact)-4], ErrDecrypt},
		{"missing part", strings.Join(parts[:4], "."), ErrDecrypt},
		{"empty", "", ErrDecrypt},
		{"oversized", strings.Repeat("a", MaxJWELength+1), ErrDecrypt},
		{"direct ECDH-ES refused", otherAlg(jose.ECDH_ES, jose.A256GCM), ErrDecrypt},
		{"A128GCM refused", otherAlg(jose.ECDH_ES_A256KW, jose.A128GCM), ErrDecrypt},
		{"ECDH-ES+A128KW refused", otherAlg(jose.ECDH_ES_A128KW, jose.A256GCM), ErrDecrypt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecryptAsAgent(agent.key, tt.compact)
			wantErr(t, err, tt.want)
			if got != nil {
				t.Fatal("plaintext returned with an error")
			}
			if strings.Contains(err.Error(), bmcPassword) {
				t.Fatalf("error shows the secret: %v", err)
			}
		})
	}
	t.Run("another agent's key", func(t *testing.T) {
		got, err := DecryptAsAgent(otherAgent.key, compact)
		wantErr(t, err, ErrDecrypt)
		if got != nil || strings.Contains(err.Error(), bmcPassword) {
			t.Fatalf("got %q, %v", got, err)
		}
	})
	t.Run("not an ECDSA key", func(t *testing.T) {
		_, ed, _ := ed25519.GenerateKey(rand.Reader)
		for _, k := range []any{ed, nil, pub, "key"} {
			_, err := DecryptAsAgent(k, compact)
			wantErr(t, err, ErrBadInput)
		}
	})
	if got, err := DecryptAsAgent(agent.key, compact); err != nil || string(got) != bmcPassword {
		t.Fatalf("the untampered JWE does not decrypt: %v", err)
	}
}
