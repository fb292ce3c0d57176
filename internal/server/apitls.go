package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// apiCert serves the API's TLS certificate from the operator's files (--api-tls-cert,
// --api-tls-key) and loads them again when they change: a renewal (certbot, cert-manager) takes
// effect on the next connection, without a restart. A changed pair that does not load is
// logged once and the last good certificate stays in use; handshakes never fail on it.
type apiCert struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	loaded  filesStamp // the files the certificate in use came from
	refused filesStamp // the last changed pair that did not load (logged once, not read again)
	statErr string     // the last error reading the files' metadata (logged once)
}

// filesStamp is what says the files changed: which files (a renewal may swap a symlink or
// rename a new file in), their size and modification time.
type filesStamp struct {
	cert, key os.FileInfo
}

func (a filesStamp) same(b filesStamp) bool {
	return sameFile(a.cert, b.cert) && sameFile(a.key, b.key)
}

func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// newAPICert loads the pair at start: a missing, unreadable or mismatched pair is an error
// naming the flag and what was wrong.
func newAPICert(certFile, keyFile string, log *slog.Logger) (*apiCert, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "":
		return nil, errors.New("--api-tls-key given without --api-tls-cert: give both (TLS) or neither (plain HTTP)")
	case keyFile == "":
		return nil, errors.New("--api-tls-cert given without --api-tls-key: give both (TLS) or neither (plain HTTP)")
	}
	a := &apiCert{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := a.stat()
	if err != nil {
		return nil, err
	}
	cert, err := a.load()
	if err != nil {
		return nil, err
	}
	a.cert, a.loaded = cert, stamp
	a.warnValidity(cert, "the API's TLS certificate")
	return a, nil
}

func (a *apiCert) stat() (filesStamp, error) {
	c, err := os.Stat(a.certFile)
	if err != nil {
		return filesStamp{}, fmt.Errorf("--api-tls-cert %s: %w", a.certFile, err)
	}
	k, err := os.Stat(a.keyFile)
	if err != nil {
		return filesStamp{}, fmt.Errorf("--api-tls-key %s: %w", a.keyFile, err)
	}
	return filesStamp{cert: c, key: k}, nil
}

// load reads and checks the pair. Its errors name the flag and never hold the key.
func (a *apiCert) load() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(a.certFile)
	if err != nil {
		return nil, fmt.Errorf("--api-tls-cert %s: %w", a.certFile, err)
	}
	keyPEM, err := os.ReadFile(a.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--api-tls-key %s: %w", a.keyFile, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// X509KeyPair's errors say which of the two it could not read, or that they do not
		// match; none holds key material.
		return nil, fmt.Errorf("--api-tls-cert %s and --api-tls-key %s: %w (give the PEM certificate chain, the server's first, and its PEM private key)", a.certFile, a.keyFile, err)
	}
	return &cert, nil
}

// warnValidity logs a certificate that is not valid now: clients will refuse it.
func (a *apiCert) warnValidity(cert *tls.Certificate, what string) {
	leaf := cert.Leaf
	if leaf == nil {
		return
	}
	now := time.Now()
	switch {
	case now.After(leaf.NotAfter):
		a.log.Warn(what+" has expired: clients refuse it; renew it (the server loads the renewed files without a restart)", "cert", a.certFile, "notAfter", leaf.NotAfter)
	case now.Before(leaf.NotBefore):
		a.log.Warn(what+" is not valid yet: clients refuse it until then", "cert", a.certFile, "notBefore", leaf.NotBefore)
	}
}

// GetCertificate is tls.Config's: the pair's certificate, loaded again if its files changed.
func (a *apiCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	stamp, err := a.stat()
	if err != nil {
		// Between a renewal's steps a file may be missing for a moment: keep serving.
		if err.Error() != a.statErr {
			a.statErr = err.Error()
			a.log.Warn("cannot read the API's TLS files; serving the certificate loaded before", "error", err)
		}
		return a.cert, nil
	}
	a.statErr = ""
	if stamp.same(a.loaded) || stamp.same(a.refused) {
		return a.cert, nil
	}
	cert, err := a.load()
	if err != nil {
		a.refused = stamp
		a.log.Warn("the API's TLS files changed and do not load; serving the certificate loaded before", "error", err)
		return a.cert, nil
	}
	a.cert, a.loaded, a.refused = cert, stamp, filesStamp{}
	a.log.Info("loaded the API's renewed TLS certificate", "cert", a.certFile, "serial", certSerial(cert))
	a.warnValidity(cert, "the API's renewed TLS certificate")
	return a.cert, nil
}

// certSerial is the leaf's serial number, for the log.
func certSerial(cert *tls.Certificate) string {
	if cert.Leaf == nil {
		return ""
	}
	return cert.Leaf.SerialNumber.Text(16)
}

// tlsConfig is the API listener's TLS: TLS 1.2 at least, HTTP/2 or HTTP/1.1.
func (a *apiCert) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: a.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// warnInClear says whether to warn that the API crosses the network in clear: plain HTTP on an
// address other hosts reach.
func (s *Server) warnInClear() bool { return s.apiCert == nil && exposedInClear(s.ln.Addr()) }
