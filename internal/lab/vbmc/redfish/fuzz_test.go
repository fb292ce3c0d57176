package redfishbmc

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"bcd/internal/lab/vbmc"
)

// FuzzServe sends arbitrary bodies to every writable resource: the service must answer with a
// status (never panic) and never an internal error for bad input.
func FuzzServe(f *testing.F) {
	f.Add(0, []byte(`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`))
	f.Add(1, []byte(`{"ResetType":"On"}`))
	f.Add(2, []byte(`{"Image":"file:///nonexistent.iso"}`))
	f.Add(3, []byte(`{"Password":"12345678"}`))
	f.Add(4, []byte(`{"UserName":"admin","Password":"x"}`))
	f.Add(0, []byte(`{"Boot":3}`))
	f.Add(1, []byte(`nope`))
	f.Add(5, []byte(`{"Attributes":{"ProcCoreDisable":2,"EmbNicPxe":false},"@Redfish.SettingsApplyTime":{"ApplyTime":"OnReset"}}`))
	f.Add(5, []byte(`{"Attributes":{"SetupPassword":null,"X":[1]}}`))
	targets := []struct{ method, path string }{
		{"PATCH", systemURI}, {"POST", resetURI}, {"POST", cdURI + "/Actions/VirtualMedia.InsertMedia"},
		{"PATCH", accountURI}, {"POST", sessionsURI}, {"PATCH", biosSettingsURI},
	}
	f.Fuzz(func(t *testing.T, which int, body []byte) {
		if which < 0 {
			which = -which
		}
		tg := targets[which%len(targets)]
		svc, err := New(Config{Username: "admin", Password: "password1", AllowFileImages: true, MediaDir: t.TempDir()}, vbmc.NewFakeMachine())
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(tg.method, tg.path, bytes.NewReader(body))
		req.SetBasicAuth("admin", "password1")
		rec := httptest.NewRecorder()
		svc.ServeHTTP(rec, req)
		if rec.Code == http.StatusInternalServerError {
			t.Fatalf("%s %s %q: internal error %s", tg.method, tg.path, body, rec.Body)
		}
	})
}
