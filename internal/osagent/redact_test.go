package osagent

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// No formatting verb and no log handler shows the instance token: it is the node's one-time
// credential, and the console and logs of a machine are read by many.
func TestMetadataNeverShowsTheToken(t *testing.T) {
	const secret = "bcdi_SecretInstanceToken"
	md := Metadata{NodeID: "n1", Gateway: "https://gw:8443", InstanceToken: secret, CA: "PEM"}
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("metadata", "metadata", md)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("metadata", "metadata", md, "ptr", &md)
	cases := map[string]string{
		"%v": fmt.Sprintf("%v", md), "%+v": fmt.Sprintf("%+v", md), "%#v": fmt.Sprintf("%#v", md),
		"%s": fmt.Sprintf("%s", md), "%q": fmt.Sprintf("%q", md), "%x": fmt.Sprintf("%x", md),
		"pointer %#v": fmt.Sprintf("%#v", &md), "pointer %+v": fmt.Sprintf("%+v", &md),
		"in a struct %+v": fmt.Sprintf("%+v", struct{ M Metadata }{md}), "in a struct %#v": fmt.Sprintf("%#v", struct{ M Metadata }{md}),
		"slog text": text.String(), "slog json": js.String(),
	}
	for name, out := range cases {
		if strings.Contains(out, "SecretInstanceToken") || strings.Contains(out, fmt.Sprintf("%x", secret)) {
			t.Errorf("%s shows the token: %s", name, out)
		}
		if !strings.Contains(out, "n1") && name != "%x" {
			t.Errorf("%s does not name the node: %s", name, out)
		}
	}
}
