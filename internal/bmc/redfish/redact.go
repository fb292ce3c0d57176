package redfish

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"bcd/internal/bmc"

	"github.com/stmcginnis/gofish/schemas"
)

// redactor hides, in text a BMC sent back, what the driver sent it that may be a credential: a
// BMC's error message may echo a request's values (the Image of an InsertMedia, the Password of
// a session login or an account PATCH).
type redactor struct {
	urls    []string // shown as bmc.ShownAddress shows them
	secrets []string // replaced, the longest first
}

// hidden is one value a redactor hides: a secret, or a URL.
type hidden struct {
	value string
	url   bool
}

// hideSecret hides s (a password) wherever it appears.
func hideSecret(s string) hidden { return hidden{value: s} }

// hideURL shows u without user information, query and fragment, and hides each of those (and
// the password, the query's parameters and values) wherever it appears alone.
func hideURL(u string) hidden { return hidden{value: u, url: true} }

func newRedactor(hide ...hidden) redactor {
	var r redactor
	for _, h := range hide {
		switch {
		case h.value == "":
		case !h.url: // a password, hidden however short
			r.secrets = append(r.secrets, h.value)
		default:
			if bmc.ShownAddress(h.value) != h.value {
				r.urls = append(r.urls, h.value)
			}
			r.secrets = append(r.secrets, bmc.AddressSecrets(h.value)...)
		}
	}
	slices.SortFunc(r.urls, func(a, b string) int { return len(b) - len(a) })
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	return r
}

// text is s with the URLs shown and the secrets replaced.
func (r redactor) text(s string) string {
	for _, u := range r.urls {
		s = strings.ReplaceAll(s, u, bmc.ShownAddress(u))
	}
	for _, p := range r.secrets {
		s = strings.ReplaceAll(s, p, "[redacted]")
	}
	return s
}

// message is BMCMessage(err) redacted: the BMC's text before it is clipped, so that a cut
// cannot leave the start of a secret behind.
func (r redactor) message(err error) string {
	if isRedfishError(err) {
		return BMCMessage(r.cause(err))
	}
	return r.text(BMCMessage(err))
}

// cause is what an *Error wraps for err: a BMC's answer (*schemas.Error, whose Error() prints
// the whole body it was read from, up to maxAnswer bytes) is replaced by one holding only its
// status, code and message ids (registry names, kept as they are: Transient and NotSupported
// read them) and its messages, redacted (BMCMessage clips them), so that no one reaching it
// through errors.As prints a secret the BMC echoed; any other error is the driver's own and kept.
func (r redactor) cause(err error) error {
	var re *schemas.Error
	if !errors.As(err, &re) {
		return err
	}
	type info struct {
		MessageID string `json:"MessageId,omitempty"`
		Message   string `json:"Message,omitempty"`
	}
	var body struct {
		Error struct {
			Code    string `json:"code,omitempty"`
			Message string `json:"message,omitempty"`
			Infos   []info `json:"@Message.ExtendedInfo,omitempty"`
		} `json:"error"`
	}
	body.Error.Code = re.Code
	body.Error.Message = r.text(re.Message)
	for _, m := range re.ExtendedInfos {
		body.Error.Infos = append(body.Error.Infos, info{MessageID: m.MessageID, Message: r.text(m.Message)})
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(body) != nil {
		return schemas.ConstructError(re.HTTPReturnedStatusCode, nil)
	}
	return schemas.ConstructError(re.HTTPReturnedStatusCode, bytes.TrimSpace(b.Bytes()))
}
