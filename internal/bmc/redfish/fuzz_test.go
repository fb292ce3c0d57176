package redfish_test

import (
	"strings"
	"testing"

	"bcd/internal/bmc/redfish"

	"github.com/stmcginnis/gofish/schemas"
)

// FuzzBMCError parses arbitrary error bodies from a BMC: classification and message extraction
// must not panic, and the message is never empty.
func FuzzBMCError(f *testing.F) {
	f.Add(503, []byte(`{"error":{"code":"Base.1.15.GeneralError","message":"busy","@Message.ExtendedInfo":[{"MessageId":"Base.1.15.NodeBusy","Message":"Node busy"}]}}`))
	f.Add(400, []byte(`{"error":{"@Message.ExtendedInfo":[{"MessageId":"IDRAC.2.8.UnableToModifyDuringSystemPOST"}]}}`))
	f.Add(409, []byte(`not json`))
	f.Add(0, []byte(``))
	f.Add(412, []byte(`{"error":null}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		err := schemas.ConstructError(status, body)
		_ = redfish.Transient(err)
		if msg := redfish.BMCMessage(err); msg == "" && (status != 0 || len(body) > 0) {
			t.Fatalf("empty message for %d %q", status, body)
		}
	})
}

// FuzzNormalizeMAC: any output is a canonical MAC or empty.
func FuzzNormalizeMAC(f *testing.F) {
	for _, s := range []string{"52:54:00:AB:CD:EF", "52-54-00-ab-cd-ef", "5254.00ab.cdef", "", "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := redfish.NormalizeMAC(s)
		if got != "" && (len(got) != 17 || strings.ToLower(got) != got || redfish.NormalizeMAC(got) != got) {
			t.Fatalf("NormalizeMAC(%q) = %q", s, got)
		}
	})
}
