package bmc

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestShownAddress(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.0.0.7", "10.0.0.7"},
		{"10.0.0.7:623", "10.0.0.7:623"},
		{"https://bmc.example:8443", "https://bmc.example:8443"},
		{"https://bmc.example/redfish/v1", "https://bmc.example/redfish/v1"},
		{"admin:s3cret@10.0.0.7", "10.0.0.7"},
		{"https://admin:p@ss/w?rd#x@bmc.example", "https://bmc.example"},
		{"https://bmc.example/?password=s3cret", "https://bmc.example/"},
		{"10.0.0.7:623?password=s3cret", "10.0.0.7:623"},
		{"https://bmc.example#s3cret", "https://bmc.example"},
		{"", ""},
	} {
		if got := ShownAddress(c.in); got != c.want {
			t.Errorf("ShownAddress(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// An endpoint printed or logged shows its address as ShownAddress does, never a credential it
// carries.
func TestEndpointShowsTheAddressWithoutCredentials(t *testing.T) {
	ep := Endpoint{Address: "https://root:s3cret@bmc.example/?token=t0ken", Username: "root", Password: "pw"}
	var log strings.Builder
	slog.New(slog.NewJSONHandler(&log, nil)).Info("x", "bmc", ep)
	for _, shown := range []string{ep.String(), fmt.Sprint(ep), fmt.Sprintf("%#v", ep), log.String()} {
		if strings.Contains(shown, "s3cret") || strings.Contains(shown, "t0ken") || !strings.Contains(shown, "bmc.example") {
			t.Errorf("shown as %q", shown)
		}
	}
}
