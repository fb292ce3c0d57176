package bmc

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// An endpoint logged as a value, with either of slog's handlers, never shows its password.
func TestEndpointLogNeverShowsThePassword(t *testing.T) {
	e := Endpoint{Address: "https://10.0.0.5", Username: "root", Password: "hunter2-secret", FingerprintSHA256: "ab"}
	for _, h := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var b bytes.Buffer
		slog.New(h(&b)).Info("bmc", "endpoint", e, "as_any", any(e))
		if out := b.String(); strings.Contains(out, "hunter2") || !strings.Contains(out, "10.0.0.5") {
			t.Errorf("logged %s", out)
		}
	}
}

// Printed with any verb, alone or inside another value, an endpoint never shows its password.
func TestEndpointFormatNeverShowsThePassword(t *testing.T) {
	e := Endpoint{Address: "10.0.0.5", Username: "root", Password: "hunter2-secret"}
	holder := struct {
		Node string
		BMC  Endpoint
	}{"n1", e}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, v := range []any{e, &e, holder, &holder} {
			if out := fmt.Sprintf(verb, v); strings.Contains(out, "hunter2") || !strings.Contains(out, "10.0.0.5") {
				t.Errorf("%s of %T: %s", verb, v, out)
			}
		}
	}
}
