package redfish_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"

	"github.com/stmcginnis/gofish/schemas"
)

// echoErr is a BMC's refusal that quotes the value it refused, as the DMTF Base registry's
// ActionParameterValueFormatError and PropertyValueFormatError messages do.
func echoErr(status int, messageID, value string) (int, any) {
	return status, map[string]any{"error": map[string]any{"code": "Base.1.8.GeneralError",
		"message": "A value is invalid: " + value,
		"@Message.ExtendedInfo": []any{map[string]any{"MessageId": messageID,
			"Message":     "The value '" + value + "' is in an invalid format.",
			"MessageArgs": []any{value}, "Resolution": "Correct " + value + " and resubmit."}}}}
}

// errorTexts is every text err shows: its own, and that of each error it wraps (what a caller
// reaching a *schemas.Error through errors.As would print).
func errorTexts(err error) []string {
	var out []string
	for e := err; e != nil; e = errors.Unwrap(e) {
		out = append(out, e.Error())
	}
	var re *schemas.Error
	if errors.As(err, &re) {
		out = append(out, re.Error())
	}
	return out
}

// TestImageURLNeverShown: an image URL's user information, query and fragment (a pre-signed
// URL's signature, a password) never appear in an error, its wrapped cause or a log line, whether
// the BMC's answers (busy, retried and logged, then a refusal) echo the whole URL back or not.
// The URL itself is named as bmc.ShownAddress shows it.
func TestImageURLNeverShown(t *testing.T) {
	tests := []struct {
		name    string
		image   string
		secrets []string
	}{
		{"pre-signed query and fragment", "https://images.example/boot.iso?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=5ign4ture#tok=fr4gment",
			[]string{"AKIAEXAMPLE", "5ign4ture", "fr4gment", "X-Amz"}},
		{"user information with '/'", "http://deploy:pa/ss-W0rd@images.example/boot.iso",
			[]string{"pa/ss-W0rd", "deploy:"}},
		{"escaped password, query", "http://deploy:S3cr%2Ft@images.example/boot.iso?token=t0ken-value",
			[]string{"S3cr%2Ft", "S3cr/t", "t0ken-value"}},
		{"fragment only", "https://images.example/boot.iso#access_token=fr4gment-only", []string{"fr4gment-only", "access_token"}},
	}
	for _, tt := range tests {
		for _, echo := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/echo=%v", tt.name, echo), func(t *testing.T) {
				imageURLNeverShown(t, tt.image, tt.secrets, echo)
			})
		}
	}
}

func imageURLNeverShown(t *testing.T, image string, secrets []string, echo bool) {
	const vm = sys1 + "/VirtualMedia"
	s := newScripted()
	s.docs["/redfish/v1/Systems"] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(sys1)}} }
	s.docs[sys1] = func() (int, any) {
		return 200, map[string]any{"@odata.id": sys1, "PowerState": "On", "VirtualMedia": ref(vm)}
	}
	s.docs[vm] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(vm + "/1")}} }
	s.docs[vm+"/1"] = func() (int, any) {
		return 200, map[string]any{"@odata.id": vm + "/1", "MediaTypes": []string{"CD"}, "Inserted": false}
	}
	busy := 1
	var sent []string // the images the BMC received
	s.posts["POST "+vm+"/1/Actions/VirtualMedia.InsertMedia"] = func(body map[string]any) (int, any) {
		img, _ := body["Image"].(string)
		sent = append(sent, img)
		if !echo {
			img = "(not quoted)"
		}
		if busy > 0 {
			busy--
			return echoErr(503, "Base.1.8.ServiceTemporarilyUnavailable", img)
		}
		return echoErr(400, "Base.1.8.ActionParameterValueFormatError", img)
	}
	logs := &syncBuffer{}
	opts := quirkOpts()
	opts.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := dial(t, serve(t, s), opts)

	err := c.InsertMedia(ctx(t), image)
	if err == nil {
		t.Fatal("InsertMedia succeeded against a BMC that refuses the image")
	}
	s.locked(func() {
		if len(sent) != 2 || sent[1] != image {
			t.Errorf("the BMC received %q: want the image as given, twice (a busy answer retried)", sent)
		}
	})
	if !strings.Contains(logs.String(), "retrying") {
		t.Errorf("the busy answer was not logged:\n%s", logs)
	}
	if !strings.Contains(err.Error(), bmc.ShownAddress(image)) || !strings.Contains(err.Error(), "ActionParameterValueFormatError") {
		t.Errorf("error %q does not name the image (%s) and the BMC's refusal", err, bmc.ShownAddress(image))
	}
	var re *schemas.Error
	if !errors.As(err, &re) || re.HTTPReturnedStatusCode != 400 || !strings.Contains(redfish.BMCMessage(re), "ActionParameterValueFormatError") {
		t.Errorf("the error does not wrap the BMC's answer (status, message id): %#v", re)
	}
	for _, text := range append(errorTexts(err), logs.String(), c.String()) {
		for _, secret := range append(secrets, image) {
			if strings.Contains(text, secret) {
				t.Errorf("%q shows %q", text, secret)
			}
		}
	}
}

// TestNewPasswordNeverShown: a BMC refusing a new password and quoting it back does not put it
// in the error, its cause or the log.
func TestNewPasswordNeverShown(t *testing.T) {
	const (
		accounts = "/redfish/v1/AccountService/Accounts"
		account  = accounts + "/2"
		newPass  = "N3w-Pa55word-Refused"
	)
	s := newScripted()
	s.docs["/redfish/v1/AccountService"] = func() (int, any) { return 200, map[string]any{"Accounts": ref(accounts)} }
	s.docs[accounts] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(account)}} }
	s.docs[account] = func() (int, any) { return 200, map[string]any{"@odata.id": account, "UserName": "u"} }
	busy := 1
	s.posts["PATCH "+account] = func(body map[string]any) (int, any) {
		pw, _ := body["Password"].(string)
		if busy > 0 {
			busy--
			return echoErr(409, "Base.1.8.ResourceInUse", pw)
		}
		return echoErr(400, "Base.1.8.PropertyValueFormatError", pw)
	}
	logs := &syncBuffer{}
	opts := quirkOpts()
	opts.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := dial(t, serve(t, s), opts)
	err := c.RotateCredential(ctx(t), newPass)
	if err == nil || !strings.Contains(err.Error(), "PropertyValueFormatError") {
		t.Fatalf("RotateCredential = %v, want the BMC's refusal", err)
	}
	if len(s.requests("PATCH "+account)) != 2 || !strings.Contains(logs.String(), "retrying") {
		t.Fatalf("the busy answer was not retried and logged: %q\n%s", s.requests("PATCH"), logs)
	}
	for _, text := range append(errorTexts(err), logs.String(), c.String()) {
		if strings.Contains(text, newPass) {
			t.Errorf("%q shows the new password", text)
		}
	}
}

// TestAddressCredentialsNeverShown: a BMC address holding a credential (user information, with a
// '/' in the password; a query; a fragment) is refused, by New and BaseURL, with an error that
// shows none of it, and no request is sent.
func TestAddressCredentialsNeverShown(t *testing.T) {
	tests := []struct {
		address string
		secrets []string
	}{
		{"https://127.0.0.1:1?X-Auth-Token=t0ken-in-query", []string{"X-Auth-Token", "t0ken-in-query"}},
		{"https://127.0.0.1:1/redfish/v1/Systems/1#fr4g-secret", []string{"fr4g-secret"}},
		{"https://127.0.0.1:1?", []string{"127.0.0.1:1?"}},
		{"https://admin:Pw/sl4sh-secret@127.0.0.1:1", []string{"admin", "Pw", "sl4sh-secret"}},
		{"https://admin:Pw-secret@127.0.0.1:1/redfish/v1/Systems/1", []string{"admin", "Pw-secret"}},
		{"127.0.0.1:1/x@y?z", []string{"x@y", "?z"}},
		{"ftp://admin:Pw-ftp-secret@127.0.0.1", []string{"admin", "Pw-ftp-secret"}},
	}
	for _, tt := range tests {
		logs := &syncBuffer{}
		opts := quirkOpts()
		opts.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c, err := redfish.New(ctx(t), bmc.Endpoint{Address: tt.address, Username: "u", Password: "Pa55word"}, opts)
		if err == nil {
			_ = c.Close(context.Background())
			t.Errorf("New(%q) accepted the address", tt.address)
			continue
		}
		texts := append(errorTexts(err), logs.String())
		if base, err := redfish.BaseURL(tt.address); err != nil {
			texts = append(texts, err.Error())
		} else {
			texts = append(texts, base)
		}
		for _, text := range texts {
			for _, secret := range tt.secrets {
				if strings.Contains(text, secret) {
					t.Errorf("New(%q): %q shows %q", tt.address, text, secret)
				}
			}
		}
	}
}
