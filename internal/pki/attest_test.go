package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestSigningInputLayout(t *testing.T) {
	st := Statement{
		CommandID:    "c1",
		NodeID:       "n",
		Kind:         "disk.wipe",
		Generation:   0x0102030405060708,
		ResultSHA256: sha256.Sum256([]byte("{}")),
	}
	// Written out by hand: this layout is what nodes sign and the store rebuilds; it must not drift.
	want := "\x00\x00\x00\x00\x00\x00\x00\x1e" + "bcd attested command result v1" +
		"\x00\x00\x00\x00\x00\x00\x00\x02" + "c1" +
		"\x00\x00\x00\x00\x00\x00\x00\x01" + "n" +
		"\x00\x00\x00\x00\x00\x00\x00\x09" + "disk.wipe" +
		"\x01\x02\x03\x04\x05\x06\x07\x08" +
		string(st.ResultSHA256[:])
	if got := SigningInput(st); string(got) != want {
		t.Fatalf("SigningInput =\n%q\nwant\n%q", got, want)
	}
	if ResultDigest([]byte("{}")) != st.ResultSHA256 {
		t.Fatal("ResultDigest is not SHA-256 of the bytes")
	}
}

func TestSigningInputNoConcatenationAmbiguity(t *testing.T) {
	pairs := [][2]Statement{
		{{CommandID: "ab", NodeID: "c", Kind: "k"}, {CommandID: "a", NodeID: "bc", Kind: "k"}},
		{{CommandID: "c", NodeID: "ab", Kind: "k"}, {CommandID: "c", NodeID: "a", Kind: "bk"}},
		{{CommandID: "c", NodeID: "n", Kind: ""}, {CommandID: "c", NodeID: "", Kind: "n"}},
		{{CommandID: "c\x00", NodeID: "n", Kind: "k"}, {CommandID: "c", NodeID: "\x00n", Kind: "k"}},
		{{CommandID: "c", NodeID: "n", Kind: "k", Generation: 1}, {CommandID: "c", NodeID: "n", Kind: "k\x00\x00\x00\x00\x00\x00\x00"}},
	}
	for i, p := range pairs {
		if bytes.Equal(SigningInput(p[0]), SigningInput(p[1])) {
			t.Errorf("pair %d: %+v and %+v have the same signing input", i, p[0], p[1])
		}
	}
}

// Property: distinct statements have distinct signing inputs. Small alphabets make field
// boundary shifts (the ambiguity length prefixes exist to prevent) likely.
func TestSigningInputInjectiveProperty(t *testing.T) {
	str := rapid.StringOfN(rapid.SampledFrom([]rune{'a', 'b', '\x00', '\x01'}), 0, 6, -1)
	stmt := rapid.Custom(func(t *rapid.T) Statement {
		var d [32]byte
		d[0] = rapid.Byte().Draw(t, "d0")
		return Statement{
			CommandID:    str.Draw(t, "cmd"),
			NodeID:       str.Draw(t, "node"),
			Kind:         str.Draw(t, "kind"),
			Generation:   rapid.Uint64Range(0, 3).Draw(t, "gen"),
			ResultSHA256: d,
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		a, b := stmt.Draw(t, "a"), stmt.Draw(t, "b")
		if (a == b) != bytes.Equal(SigningInput(a), SigningInput(b)) {
			t.Fatalf("a=%+v b=%+v: equal=%v but inputs equal=%v", a, b, a == b, !(a == b))
		}
	})
}

// attestFixture is a CA and one certificate of each kind around node n1 at generation 5.
type attestFixture struct {
	ca                                             *CA
	node, node2, tenant, site, server, foreignNode issued
	base                                           Statement
}

func newAttestFixture(t *testing.T) attestFixture {
	t.Helper()
	ca := newCA(t)
	foreign, err := CreateCA("test CA", t0()) // same name, other key
	if err != nil {
		t.Fatal(err)
	}
	return attestFixture{
		ca:          ca,
		node:        issue(t, ca, NodeIdentity("n1", 5), time.Hour),
		node2:       issue(t, ca, NodeIdentity("n2", 5), time.Hour),
		tenant:      issue(t, ca, NodeTenantIdentity("n1", "acme", 5), time.Hour),
		site:        issue(t, ca, SiteAgentIdentity("s1", "agent-1"), time.Hour),
		server:      issue(t, ca, ServerIdentity(), time.Hour),
		foreignNode: issue(t, foreign, NodeIdentity("n1", 5), time.Hour),
		base: Statement{
			CommandID:    "cmd-0001",
			NodeID:       "n1",
			Kind:         "disk.wipe",
			Generation:   5,
			ResultSHA256: ResultDigest([]byte(`{"disks":[{"dev":"/dev/sda","readback":"passed"}]}`)),
		},
	}
}

func sign(t *testing.T, key crypto.Signer, st Statement) []byte {
	t.Helper()
	sig, err := SignStatement(key, st)
	if err != nil {
		t.Fatalf("SignStatement: %v", err)
	}
	return sig
}

func TestVerifyStatement(t *testing.T) {
	f := newAttestFixture(t)
	base := f.base
	goodSig := sign(t, f.node.key, base)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

	with := func(mod func(*Statement)) Statement { s := base; mod(&s); return s }
	type tc struct {
		name    string
		cert    []byte
		st      Statement // what the verifier rebuilds
		sig     []byte
		current uint64
		at      time.Time
		want    error
	}
	tests := []tc{
		{"valid", f.node.cert, base, goodSig, 5, t0(), nil},
		// A relay alters one field of the stored result: the signature no longer covers it.
		{"altered command id", f.node.cert, with(func(s *Statement) { s.CommandID = "cmd-0002" }), goodSig, 5, t0(), ErrBadSignature},
		{"altered node id", f.node.cert, with(func(s *Statement) { s.NodeID = "n2" }), goodSig, 5, t0(), ErrBadSignature},
		{"altered kind", f.node.cert, with(func(s *Statement) { s.Kind = "disk.wipe.quick" }), goodSig, 5, t0(), ErrBadSignature},
		{"altered generation", f.node.cert, with(func(s *Statement) { s.Generation = 6 }), goodSig, 6, t0(), ErrBadSignature},
		{"altered result", f.node.cert, with(func(s *Statement) { s.ResultSHA256 = ResultDigest([]byte(`{"disks":[]}`)) }), goodSig, 5, t0(), ErrBadSignature},
		{"altered result one bit", f.node.cert, with(func(s *Statement) { s.ResultSHA256[31] ^= 1 }), goodSig, 5, t0(), ErrBadSignature},
		{"forged by another key", f.node.cert, base, sign(t, other, base), 5, t0(), ErrBadSignature},
		{"signature of another statement", f.node.cert, base, sign(t, f.node.key, with(func(s *Statement) { s.CommandID = "x" })), 5, t0(), ErrBadSignature},
		{"truncated signature", f.node.cert, base, goodSig[:len(goodSig)-1], 5, t0(), ErrBadSignature},
		{"empty signature", f.node.cert, base, nil, 5, t0(), ErrBadSignature},
		{"tenant cannot attest", f.tenant.cert, base, sign(t, f.tenant.key, base), 5, t0(), ErrTenantCannotAttest},
		{"site agent is not a node", f.site.cert, base, sign(t, f.site.key, base), 5, t0(), ErrNotNodeIdentity},
		{"server is not a node", f.server.cert, base, sign(t, f.server.key, base), 5, t0(), ErrNotNodeIdentity},
		{"other node", f.node2.cert, base, sign(t, f.node2.key, base), 5, t0(), ErrNodeMismatch},
		{"statement names another generation", f.node.cert, with(func(s *Statement) { s.Generation = 6 }),
			sign(t, f.node.key, with(func(s *Statement) { s.Generation = 6 })), 6, t0(), ErrGenerationMismatch},
		{"revoked: generation bumped", f.node.cert, base, goodSig, 6, t0(), ErrIdentityRevoked},
		{"current generation behind the certificate", f.node.cert, base, goodSig, 4, t0(), ErrIdentityRevoked},
		{"certificate of another CA", f.foreignNode.cert, base, sign(t, f.foreignNode.key, base), 5, t0(), ErrUnknownCA},
		{"expired certificate", f.node.cert, base, goodSig, 5, t0().Add(time.Hour + time.Second), ErrCertExpired},
		{"garbage certificate", []byte("junk"), base, goodSig, 5, t0(), ErrCertInvalid},
		{"empty command id", f.node.cert, with(func(s *Statement) { s.CommandID = "" }), goodSig, 5, t0(), ErrBadStatement},
		{"empty kind", f.node.cert, with(func(s *Statement) { s.Kind = "" }), goodSig, 5, t0(), ErrBadStatement},
		{"bad node id", f.node.cert, with(func(s *Statement) { s.NodeID = "n1/../n2" }), goodSig, 5, t0(), ErrBadStatement},
	}
	// Twice: the CA remembers verified certificates and signatures, and a remembered success
	// must never carry over to altered input, a later generation or an expired certificate.
	for pass := range 2 {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/pass%d", tt.name, pass+1), func(t *testing.T) {
				err := VerifyStatement(f.ca, tt.cert, tt.st, tt.sig, tt.current, tt.at)
				wantErr(t, err, tt.want)
			})
		}
	}
	wantErr(t, VerifyStatement(nil, f.node.cert, base, goodSig, 5, t0()), ErrBadInput)
}

func TestVerifySiteStatement(t *testing.T) {
	f := newAttestFixture(t)
	st := Statement{CommandID: "cmd-rot-1", NodeID: "n1", Kind: "bmc.rotate", ResultSHA256: ResultDigest([]byte(`{"verified":true}`))}
	siteSig := sign(t, f.site.key, st)
	altered := st
	altered.ResultSHA256 = ResultDigest([]byte(`{"verified":false}`))
	tests := []struct {
		name   string
		cert   []byte
		sig    []byte
		st     Statement
		siteID string
		at     time.Time
		want   error
	}{
		{"own site", f.site.cert, siteSig, st, "s1", t0(), nil},
		{"other site", f.site.cert, siteSig, st, "s2", t0(), ErrSiteMismatch},
		{"altered result", f.site.cert, siteSig, altered, "s1", t0(), ErrBadSignature},
		{"node cert", f.node.cert, sign(t, f.node.key, st), st, "s1", t0(), ErrNotSiteIdentity},
		{"tenant cert", f.tenant.cert, sign(t, f.tenant.key, st), st, "s1", t0(), ErrNotSiteIdentity},
		{"server cert", f.server.cert, sign(t, f.server.key, st), st, "s1", t0(), ErrNotSiteIdentity},
		{"site cert, node's signature", f.site.cert, sign(t, f.node.key, st), st, "s1", t0(), ErrBadSignature},
		{"expired", f.site.cert, siteSig, st, "s1", t0().Add(2 * time.Hour), ErrCertExpired},
		{"another CA", f.foreignNode.cert, sign(t, f.foreignNode.key, st), st, "s1", t0(), ErrUnknownCA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, VerifySiteStatement(f.ca, tt.cert, tt.st, tt.sig, tt.siteID, tt.at), tt.want)
		})
	}
	// And the site agent's signature never passes as a node attestation.
	wantErr(t, VerifyStatement(f.ca, f.site.cert, st, siteSig, 0, t0()), ErrNotNodeIdentity)
}

// The decision rules, over every kind and every relation between node IDs and generations.
func TestNodeStatementDecisionExhaustive(t *testing.T) {
	kinds := []Kind{KindUnknown, KindSiteAgent, KindNode, KindNodeTenant, KindServer, Kind(200)}
	for _, k := range kinds {
		for _, sameNode := range []bool{true, false} {
			for _, stGen := range []uint64{4, 5, 6} {
				for _, current := range []uint64{4, 5, 6} {
					id := Identity{Kind: k, NodeID: "n1", Generation: 5}
					st := Statement{CommandID: "c", NodeID: "n1", Kind: "disk.wipe", Generation: stGen}
					if !sameNode {
						st.NodeID = "n2"
					}
					var want error
					switch {
					case k == KindNodeTenant:
						want = ErrTenantCannotAttest
					case k != KindNode:
						want = ErrNotNodeIdentity
					case !sameNode:
						want = ErrNodeMismatch
					case stGen != 5:
						want = ErrGenerationMismatch
					case current != 5:
						want = ErrIdentityRevoked
					}
					name := fmt.Sprintf("%s/sameNode=%v/stGen=%d/current=%d", k, sameNode, stGen, current)
					err := nodeStatementDecision(id, st, current)
					if want == nil && err != nil || want != nil && !errors.Is(err, want) {
						t.Errorf("%s: got %v, want %v", name, err, want)
					}
					// Exactly one sentinel: callers record one reason.
					if err != nil {
						n := 0
						for _, s := range allSentinels() {
							if errors.Is(err, s) {
								n++
							}
						}
						if n != 1 {
							t.Errorf("%s: error %v wraps %d sentinels", name, err, n)
						}
					}
				}
			}
		}
	}
}

func TestSiteStatementDecisionExhaustive(t *testing.T) {
	for _, k := range []Kind{KindUnknown, KindSiteAgent, KindNode, KindNodeTenant, KindServer, Kind(200)} {
		for _, site := range []string{"s1", "s2", ""} {
			id := Identity{Kind: k, SiteID: "s1", AgentID: "a"}
			var want error
			switch {
			case k != KindSiteAgent:
				want = ErrNotSiteIdentity
			case site != "s1":
				want = ErrSiteMismatch
			}
			err := siteStatementDecision(id, site)
			if want == nil && err != nil || want != nil && !errors.Is(err, want) {
				t.Errorf("%s/site=%q: got %v, want %v", k, site, err, want)
			}
		}
	}
}

func allSentinels() []error {
	return []error{ErrBadIdentity, ErrBadCSR, ErrBadInput, ErrUnknownCA, ErrCertExpired, ErrCertInvalid,
		ErrBadSignature, ErrBadStatement, ErrTenantCannotAttest, ErrNotNodeIdentity, ErrNodeMismatch,
		ErrGenerationMismatch, ErrIdentityRevoked, ErrNotSiteIdentity, ErrSiteMismatch, ErrNotRecipient, ErrDecrypt}
}

func TestSentinelsDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range allSentinels() {
		if seen[s.Error()] {
			t.Fatalf("duplicate sentinel %q", s)
		}
		seen[s.Error()] = true
	}
}

func TestSignStatementRefuses(t *testing.T) {
	good := Statement{CommandID: "c", NodeID: "n", Kind: "k"}
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name string
		key  crypto.Signer
		st   Statement
		want error
	}{
		{"ok", p256, good, nil},
		{"nil key", nil, good, ErrBadInput},
		{"P-384", p384, good, ErrBadInput},
		{"ed25519", ed, good, ErrBadInput},
		{"no command", p256, Statement{NodeID: "n", Kind: "k"}, ErrBadStatement},
		{"no node", p256, Statement{CommandID: "c", Kind: "k"}, ErrBadStatement},
		{"no kind", p256, Statement{CommandID: "c", NodeID: "n"}, ErrBadStatement},
		{"long command", p256, Statement{CommandID: strings.Repeat("c", MaxCommandIDLength+1), NodeID: "n", Kind: "k"}, ErrBadStatement},
		{"long kind", p256, Statement{CommandID: "c", NodeID: "n", Kind: strings.Repeat("k", MaxCommandKindLength+1)}, ErrBadStatement},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sig, err := SignStatement(tt.key, tt.st)
			wantErr(t, err, tt.want)
			if tt.want == nil && len(sig) == 0 {
				t.Fatal("empty signature")
			}
		})
	}
}
