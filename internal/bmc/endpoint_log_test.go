package bmc

import (
	"bytes"
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
