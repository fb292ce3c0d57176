package engine

import (
	"errors"
	"strings"
	"testing"

	"bcd/internal/store"
)

func TestRotationOutcome(t *testing.T) {
	signed := func(s store.Command) store.Command { s.ResultSig, s.SignerCert = []byte{1}, []byte{2}; return s }
	good := func(store.Command) error { return nil }
	bad := func(store.Command) error { return errors.New("signature does not verify") }
	cases := []struct {
		name   string
		c      store.Command
		verify func(store.Command) error
		want   string // "" = current
	}{
		{"verified", signed(store.Command{State: "succeeded", Result: `{"verified":true}`}), good, ""},
		{"driver failed", store.Command{State: "failed", Error: "PasswordPolicy"}, good, "PasswordPolicy"},
		{"agent lost after acknowledging", store.Command{State: "lost"}, good, "lost"},
		{"not finished", store.Command{State: "running"}, good, "not finished"},
		{"unsigned", store.Command{State: "succeeded", Result: `{"verified":true}`}, good, "not signed"},
		{"bad signature", signed(store.Command{State: "succeeded", Result: `{"verified":true}`}), bad, "does not verify"},
		{"login not verified", signed(store.Command{State: "succeeded", Result: `{"verified":false}`}), good, "did not verify a login"},
		{"result not JSON", signed(store.Command{State: "succeeded", Result: `nope`}), good, "not JSON"},
	}
	for _, c := range cases {
		err := RotationOutcome(c.c, c.verify)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
