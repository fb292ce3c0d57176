package pki

import (
	"crypto/sha256"
	"strings"
	"testing"
)

func TestNewToken(t *testing.T) {
	seen := map[string]bool{}
	for _, prefix := range []string{JoinTokenPrefix, DiscoveryTokenPrefix, InstanceTokenPrefix, APITokenPrefix} {
		for range 200 {
			plain, hash, err := NewToken(prefix)
			if err != nil {
				t.Fatal(err)
			}
			body, ok := strings.CutPrefix(plain, prefix)
			if !ok || len(body) != 52 {
				t.Fatalf("token %q: want %s + 52 characters", plain, prefix)
			}
			if strings.Trim(body, "abcdefghijklmnopqrstuvwxyz234567") != "" {
				t.Fatalf("token %q has characters outside lower-case base32", plain)
			}
			if seen[plain] {
				t.Fatalf("token %q repeated", plain)
			}
			seen[plain] = true
			sum := sha256.Sum256([]byte(plain))
			if string(hash) != string(sum[:]) || string(HashToken(plain)) != string(sum[:]) {
				t.Fatal("hash is not SHA-256 of the whole token")
			}
			if !TokenMatches(plain, hash) {
				t.Fatal("token does not match its own hash")
			}
		}
	}
}

func TestTokenMatchesRefuses(t *testing.T) {
	plain, hash, err := NewToken(JoinTokenPrefix)
	if err != nil {
		t.Fatal(err)
	}
	other, _, _ := NewToken(JoinTokenPrefix)
	last := plain[len(plain)-1]
	flipped := plain[:len(plain)-1] + string(map[bool]byte{true: 'b', false: 'a'}[last == 'a'])
	tests := []struct {
		name  string
		plain string
		hash  []byte
	}{
		{"other token", other, hash},
		{"last character changed", flipped, hash},
		{"prefix changed", APITokenPrefix + strings.TrimPrefix(plain, JoinTokenPrefix), hash},
		{"no prefix", strings.TrimPrefix(plain, JoinTokenPrefix), hash},
		{"upper case", strings.ToUpper(plain), hash},
		{"trailing space", plain + " ", hash},
		{"empty", "", hash},
		{"short hash", plain, hash[:31]},
		{"long hash", plain, append(append([]byte{}, hash...), 0)},
		{"nil hash", plain, nil},
		{"the hash of empty, for empty", "", nil},
	}
	for _, tt := range tests {
		if TokenMatches(tt.plain, tt.hash) {
			t.Errorf("%s: matched", tt.name)
		}
	}
}

func TestNewTokenPrefix(t *testing.T) {
	tests := map[string]bool{
		"bcdj_":                 true,
		"a":                     true,
		"x9_":                   true,
		strings.Repeat("a", 16): true,
		"":                      false,
		strings.Repeat("a", 17): false,
		"BCD_":                  false,
		"bcd-":                  false,
		"bcd ":                  false,
		"bcd.":                  false,
		"bcd\n":                 false,
	}
	for prefix, ok := range tests {
		plain, hash, err := NewToken(prefix)
		if ok {
			wantErr(t, err, nil)
			continue
		}
		wantErr(t, err, ErrBadInput)
		if plain != "" || hash != nil {
			t.Errorf("prefix %q: token returned with an error", prefix)
		}
	}
}
