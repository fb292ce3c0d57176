package ipmi

import (
	"context"
	"testing"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/app"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/rmcpplus"
	"github.com/bougou/go-ipmi/pkg/types"
)

// FuzzBMCAnswers feeds arbitrary datagrams, as a BMC (or anyone who can send from its address)
// would answer, to go-ipmi's parsers for every answer the driver reads: the RMCP / RMCP+ frame,
// the session setup (Open Session, RAKP 2 and 4) and the commands' responses. A panic there would
// take the whole site agent down.
func FuzzBMCAnswers(f *testing.F) {
	f.Add([]byte{0x06, 0x00, 0xff, 0x07, 0x06, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0x81, 0x1c, 0x63, 0x20, 0x04, 0x38, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, _ := client.NewClient("127.0.0.1", 1, "u", "p")
		ctx := context.Background()
		resps := []struct {
			cmd types.Command
			r   types.Response
		}{
			{types.CommandGetChannelAuthCapabilities, &app.GetChannelAuthenticationCapabilitiesResponse{}},
			{types.CommandGetChassisStatus, &chassis.GetChassisStatusResponse{}},
			{types.CommandGetSystemGUID, &app.GetSystemGUIDResponse{}},
			{types.CommandGetSessionInfo, &app.GetSessionInfoResponse{}},
			{types.CommandGetSystemBootOptions, &chassis.GetSystemBootOptionsParamResponse{}},
			{types.CommandChassisControl, &chassis.ChassisControlResponse{}},
		}
		for _, r := range resps {
			_ = c.ParseRmcpResponse(ctx, b, r.cmd, r.r)
		}
		var open rmcpplus.OpenSessionResponse
		_ = open.Unpack(b)
		var r2 rmcpplus.RAKPMessage2
		_ = r2.Unpack(b)
		var r4 rmcpplus.RAKPMessage4
		_ = r4.Unpack(b)
		var rm types.Rmcp
		_ = rm.Unpack(b)
		var bf types.BootOptionParam_BootFlags
		_ = bf.Unpack(b)
	})
}
