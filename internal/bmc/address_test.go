package bmc

import (
	"fmt"
	"log/slog"
	"slices"
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

func TestAddressSecrets(t *testing.T) {
	tests := []struct {
		addr string
		want []string
	}{
		{"https://10.0.0.5", nil},
		{"https://admin:S3cr%2Ft@10.0.0.5/redfish/v1", []string{"S3cr%2Ft", "S3cr/t", "admin:S3cr%2Ft"}},
		{"https://10.0.0.5?token=abcd&x=1#frag-ment", []string{"abcd", "frag-ment", "token=abcd", "token=abcd&x=1#frag-ment"}},
		{"u:p@host", nil}, // every part shorter than MinSecret
		{"admin:p@ss/w?rd@host", []string{"admin:p@ss/w?rd", "p@ss/w?rd"}},
	}
	for _, tt := range tests {
		if got := AddressSecrets(tt.addr); !slices.Equal(got, tt.want) {
			t.Errorf("AddressSecrets(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}
