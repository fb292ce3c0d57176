package site

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
)

// A Redfish BMC whose sessions cannot be logged out (it names no URI for them) costs the agent
// one session, not one per command: the agent's drivers share what the first one learnt, and
// the later commands use basic auth.
func TestRedfishDriversShareWhatTheyLearnOfABMCsSessions(t *testing.T) {
	var mu sync.Mutex
	var sessions, basic int
	bmcSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if _, _, ok := r.BasicAuth(); ok {
			basic++
		}
		mu.Unlock()
		path := strings.TrimSuffix(r.URL.Path, "/")
		var body any
		switch {
		case r.Method == http.MethodPost && path == "/redfish/v1/SessionService/Sessions":
			mu.Lock()
			sessions++
			mu.Unlock()
			// A session with neither a Location header nor an @odata.id: it cannot be deleted.
			w.Header().Set("X-Auth-Token", "tok")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"Id":"7"}`))
			return
		case path == "/redfish/v1":
			body = map[string]any{"@odata.id": "/redfish/v1/", "Systems": map[string]any{"@odata.id": "/redfish/v1/Systems"},
				"Links": map[string]any{"Sessions": map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions"}}}
		case path == "/redfish/v1/Systems":
			body = map[string]any{"Members": []any{map[string]any{"@odata.id": "/redfish/v1/Systems/1"}}}
		case path == "/redfish/v1/Systems/1":
			body = map[string]any{"@odata.id": "/redfish/v1/Systems/1", "Id": "1", "PowerState": "On"}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(body)
	}))
	defer bmcSrv.Close()

	reg := builtinDrivers(redfish.Options{MaxAttempts: 1}, ipmi.Options{}, ipmi.NewPacer(ipmi.PacerConfig{}))
	ep := bmc.Endpoint{Address: bmcSrv.URL, Username: "admin", Password: "pw"}
	for i := range 3 {
		err := withDriver(context.Background(), reg, DriverRedfish, ep, "get power", capGetPower, func(ctx context.Context, drv any) error {
			_, err := drv.(bmc.PowerGetter).GetPower(ctx)
			return err
		})
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if sessions != 1 || basic == 0 {
		t.Errorf("%d sessions created over three commands and %d requests with basic auth; want 1 session, then basic auth", sessions, basic)
	}
}
