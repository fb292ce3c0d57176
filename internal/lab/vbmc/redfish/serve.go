package redfishbmc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"sync"
	"time"
)

// Cert is a self-signed certificate for a virtual BMC.
type Cert struct {
	TLS               tls.Certificate
	PEM               []byte // the certificate, PEM encoded (a CA bundle for clients)
	FingerprintSHA256 string // hex SHA-256 of the certificate's DER
}

// SelfSignedCert makes a P-256 certificate valid for a day for hosts (IP addresses or names).
func SelfSignedCert(hosts ...string) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, fmt.Errorf("generating BMC key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return Cert{}, fmt.Errorf("generating BMC certificate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "bcd virtual BMC"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Cert{}, fmt.Errorf("creating BMC certificate: %w", err)
	}
	sum := sha256.Sum256(der)
	return Cert{
		TLS:               tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		PEM:               pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		FingerprintSHA256: hex.EncodeToString(sum[:]),
	}, nil
}

// ServeConfig says where and how a virtual BMC listens.
type ServeConfig struct {
	Addr string // e.g. "10.0.0.2:443" or "127.0.0.1:0"
	TLS  bool   // serve HTTPS with a self-signed certificate generated at start
	Log  *slog.Logger
}

// Server is a running virtual BMC.
type Server struct {
	URL  string // base URL, e.g. https://127.0.0.1:40123
	Cert Cert   // zero without TLS

	srv     *http.Server
	done    chan error
	stopped chan struct{}
	once    sync.Once
	err     error
}

// Serve starts serving h until ctx ends or Close is called.
func Serve(ctx context.Context, cfg ServeConfig, h http.Handler) (*Server, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listening for Redfish on %s: %w", cfg.Addr, err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}, done: make(chan error, 1), stopped: make(chan struct{})}
	scheme := "http"
	if cfg.TLS {
		host, _, _ := net.SplitHostPort(ln.Addr().String())
		s.Cert, err = SelfSignedCert(host, "localhost")
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		s.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{s.Cert.TLS}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, s.srv.TLSConfig)
		scheme = "https"
	}
	s.URL = scheme + "://" + ln.Addr().String()
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.stopped:
		}
	}()
	log.InfoContext(ctx, "virtual Redfish BMC listening", "url", s.URL)
	return s, nil
}

// Close stops the server and waits for it; later calls return the same result.
func (s *Server) Close() error {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := s.srv.Shutdown(ctx)
		if serr := <-s.done; serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			s.err = fmt.Errorf("stopping Redfish BMC %s: %w", s.URL, err)
		}
		close(s.stopped)
	})
	return s.err
}
