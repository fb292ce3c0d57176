package cli

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// caFileEnv gives --ca-file from the environment.
const caFileEnv = "BCD_CA_FILE"

// apiHTTP is the HTTP client of this invocation's API calls, made once (apiTLS).
func (g *globals) apiHTTP() (*http.Client, error) {
	if g.hc != nil {
		return g.hc, nil
	}
	tlsConfig, err := g.apiTLS()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConfig
	// One server, called by up to 64 goroutines (bcd node enroll --from --parallel): Go's
	// default of 2 idle connections per host would dial most calls anew.
	tr.MaxIdleConnsPerHost = maxParallel
	g.hc = &http.Client{Transport: schemeCheck{next: tr}, Timeout: 5 * time.Minute}
	return g.hc, nil
}

// apiTLS is the TLS of API calls: over https:// it trusts the CA of --ca-file (else
// $BCD_CA_FILE) alone, or the system's roots without one; TLS 1.2 at least.
func (g *globals) apiTLS() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	path, source := g.caFile, "--ca-file"
	if path == "" {
		path, source = g.env.Getenv(caFileEnv), caFileEnv
	}
	switch {
	case path == "":
	case !strings.HasPrefix(g.server, "https://") && source == "--ca-file":
		return nil, usagef("--ca-file is for a server at https://…; --server is %q", g.server)
	case strings.HasPrefix(g.server, "https://"):
		// $BCD_CA_FILE is ignored for an http:// server: the environment may hold it for
		// another one.
		pool, err := loadCAs(path, source)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// loadCAs reads the CA certificates (PEM) the flag or variable source names; anything else in
// the file is refused (a private key given by mistake is named, never printed).
func loadCAs(path, source string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: reading the CA certificates: %w", source, err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, usagef("%s %s holds a %s block: give the PEM certificate(s) of the CA that signed the server's certificate", source, path, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, usagef("%s %s: certificate %d: %w", source, path, n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, usagef("%s %s holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the certificate(s) of the CA that signed the server's certificate", source, path)
	}
	return pool, nil
}

// describeTLS is the line for an API call that failed on TLS, saying what to change; "" if err
// is not that.
func describeTLS(err error) string {
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		var host x509.HostnameError
		var invalid x509.CertificateInvalidError
		switch {
		case errors.As(verify.Err, &host):
			return "the server's TLS certificate does not name the host of --server: " + host.Error() + " (use a name it is valid for)"
		case errors.As(verify.Err, &invalid):
			return "the server's TLS certificate is refused: " + invalid.Error() + " (renew it on the server: bcd server --api-tls-cert/--api-tls-key)"
		}
		return "the server's TLS certificate is not trusted: " + verify.Err.Error() + " (give the CA that signed it with --ca-file FILE or env " + caFileEnv + ")"
	}
	if errors.Is(err, http.ErrSchemeMismatch) || errors.As(err, new(tls.RecordHeaderError)) {
		return "the server does not speak TLS at --server (https://…): use http://… for a server without --api-tls-cert"
	}
	if errors.As(err, new(plainToTLSError)) {
		return "the server speaks TLS at --server (http://…): use https://… (with --ca-file FILE or env " + caFileEnv + " if a private CA signed its certificate)"
	}
	return ""
}

// tlsPortAnswer is what Go's TLS servers (bcd server with --api-tls-cert) answer to plain HTTP.
const tlsPortAnswer = "Client sent an HTTP request to an HTTPS server."

// plainToTLSError is an http:// request answered by a TLS server: the URL's scheme is wrong.
type plainToTLSError struct{}

func (plainToTLSError) Error() string { return "http:// to a server that speaks TLS: " + tlsPortAnswer }

// schemeCheck tells an http:// request answered by a TLS server from another 400 Bad Request
// ("internal: 400 Bad Request" would not say what to change).
type schemeCheck struct{ next http.RoundTripper }

func (s schemeCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if err != nil || req.URL.Scheme != "http" || resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "" {
		return resp, err
	}
	head := make([]byte, len(tlsPortAnswer))
	n, _ := io.ReadFull(resp.Body, head)
	if string(head[:n]) == tlsPortAnswer {
		resp.Body.Close()
		return nil, plainToTLSError{}
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head[:n]), resp.Body), resp.Body}
	return resp, nil
}
