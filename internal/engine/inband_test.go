package engine

import "testing"

func TestInbandAddress(t *testing.T) {
	cases := []struct {
		result string
		want   string
	}{
		{`{"address":"10.0.0.5","userId":3}`, "10.0.0.5"},
		{`{"address":"10.0.0.5:6230"}`, "10.0.0.5:6230"},
		{`{"address":"fd00::5"}`, "fd00::5"},
		{`{"address":"[fd00::5]:623"}`, "[fd00::5]:623"},
		{`{"address":"0.0.0.0"}`, ""},
		{`{"address":"10.0.0.5:0"}`, ""},
		{`{"address":"224.0.0.1"}`, ""},
		{`{"address":"bmc.example"}`, ""},
		{`{"address":"https://10.0.0.5"}`, ""},
		{`{"address":""}`, ""},
		{`not json`, ""},
	}
	for _, c := range cases {
		got, _, err := InbandAddress(c.result)
		if got != c.want || (err == nil) != (c.want != "") {
			t.Errorf("InbandAddress(%s) = %q, %v; want %q", c.result, got, err, c.want)
		}
	}
}
