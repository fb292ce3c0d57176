// Package osjoin is what joining the gateway as a node's installed OS takes, shared by the lab
// image's OS agent (internal/osagent, bcd as the OS's PID 1) and the site agent's rejoin endpoint
// (internal/netboot: POST /rejoin, which joins on behalf of an image that runs no bcd): the
// metadata document the site agent serves (node id, gateway, CA, one-time instance token) and
// the join itself (Joiner).
package osjoin

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"bcd/internal/pki"
)

// Metadata is the site agent's /metadata document for a deployed node.
type Metadata struct {
	NodeID        string `json:"nodeId"`
	Gateway       string `json:"gateway"`
	InstanceToken string `json:"instanceToken"` // never logged: LogValue, String and GoString redact it
	CA            string `json:"ca"`            // PEM
}

// LogValue keeps the token out of logs.
func (m Metadata) LogValue() slog.Value {
	return slog.GroupValue(slog.String("node", m.NodeID), slog.String("gateway", m.Gateway),
		slog.Bool("token", m.InstanceToken != ""), slog.Bool("ca", m.CA != ""))
}

// String keeps the token out of %v.
func (m Metadata) String() string {
	return fmt.Sprintf("node=%s gateway=%s token=%t ca=%t", m.NodeID, m.Gateway, m.InstanceToken != "", m.CA != "")
}

// GoString keeps the token out of %#v.
func (m Metadata) GoString() string {
	return fmt.Sprintf("osjoin.Metadata{NodeID:%q, Gateway:%q, InstanceToken:%t, CA:%t}", m.NodeID, m.Gateway, m.InstanceToken != "", m.CA != "")
}

// ParseMetadata decodes and checks a metadata document: a node id, an https gateway, an
// instance token (bcdi_…) and a CA of parseable CA certificates. Errors never echo the token.
func ParseMetadata(b []byte) (Metadata, error) {
	var m Metadata
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return Metadata{}, fmt.Errorf("metadata is not a JSON object of nodeId, gateway, instanceToken, ca: %w", err)
	}
	switch {
	case m.NodeID == "" || len(m.NodeID) > 128 || strings.ContainsFunc(m.NodeID, notNodeIDRune):
		return Metadata{}, errors.New("metadata: nodeId missing or malformed")
	case !strings.HasPrefix(m.InstanceToken, pki.InstanceTokenPrefix) || len(m.InstanceToken) > 512 || strings.ContainsAny(m.InstanceToken, " \t\r\n"):
		return Metadata{}, fmt.Errorf("metadata: instanceToken missing or not an instance token (%s…)", pki.InstanceTokenPrefix)
	}
	if err := CheckURL(m.Gateway, true); err != nil {
		return Metadata{}, fmt.Errorf("metadata: gateway: %w", err)
	}
	if err := checkCA([]byte(m.CA)); err != nil {
		return Metadata{}, fmt.Errorf("metadata: ca: %w", err)
	}
	return m, nil
}

// notNodeIDRune is a rune a node id cannot hold: the id is printed on the console, so
// nothing but printable ASCII other than a space or a slash (no terminal escape, no line break
// of any kind that would forge a console line).
func notNodeIDRune(r rune) bool { return r <= ' ' || r > '~' || r == '/' }

// checkCA accepts PEM holding only CA certificates (at least one).
func checkCA(b []byte) error {
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return errors.New("data outside the PEM certificates")
			}
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %d is %s, not a CERTIFICATE", n+1, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return fmt.Errorf("certificate %d does not parse: %w", n+1, err)
		}
		if !c.IsCA {
			return fmt.Errorf("certificate %d is not a CA certificate", n+1)
		}
		n++
	}
	if n == 0 {
		return errors.New("missing (no PEM certificate): the site agent must publish the CA that certifies the gateway")
	}
	return nil
}

// CheckURL accepts an absolute http(s) URL with a host and no user info (https only when
// httpsOnly). The error names no part of the URL.
func CheckURL(s string, httpsOnly bool) error {
	if s == "" || len(s) > 1024 {
		return errors.New("must be a URL of 1..1024 characters")
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("URL does not parse")
	}
	switch {
	case httpsOnly && u.Scheme != "https":
		return errors.New("URL scheme must be https")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("URL scheme must be http or https")
	case u.Host == "" || u.Hostname() == "" || u.User != nil || u.Opaque != "":
		return errors.New("URL needs a host and no user info")
	}
	return nil
}
