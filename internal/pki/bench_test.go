package pki

import (
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"
)

// The CA is used by every request handler at once: issue and verify concurrently (run with -race).
func TestCAConcurrentUse(t *testing.T) {
	ca := newCA(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 4 {
				key, csr, err := NewKeyAndCSR("")
				if err != nil {
					errs <- err
					return
				}
				gen := uint64(i*10 + j)
				der, err := ca.IssueNode(csr, "n1", gen, time.Hour, t0())
				if err != nil {
					errs <- err
					return
				}
				st := Statement{CommandID: "c", NodeID: "n1", Kind: "disk.wipe", Generation: gen}
				sig, err := SignStatement(key, st)
				if err != nil {
					errs <- err
					return
				}
				if err := VerifyStatement(ca, der, st, sig, gen, t0()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func BenchmarkIssueNode(b *testing.B) {
	ca := newCA(b)
	_, csr, _ := NewKeyAndCSR("")
	for b.Loop() {
		if _, err := ca.IssueNode(csr, "n1", 1, time.Hour, t0()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSignStatement(b *testing.B) {
	key, _, _ := NewKeyAndCSR("")
	st := Statement{CommandID: "c", NodeID: "n1", Kind: "disk.wipe", Generation: 1}
	for b.Loop() {
		if _, err := SignStatement(key, st); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyStatement(b *testing.B) {
	ca := newCA(b)
	node := issue(b, ca, NodeIdentity("n1", 1), time.Hour)
	st := Statement{CommandID: "c", NodeID: "n1", Kind: "disk.wipe", Generation: 1}
	sig, _ := SignStatement(node.key, st)
	for b.Loop() {
		if err := VerifyStatement(ca, node.cert, st, sig, 1, t0()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJWERoundTrip(b *testing.B) {
	ca := newCA(b)
	agent := issue(b, ca, SiteAgentIdentity("s", "a"), time.Hour)
	for b.Loop() {
		c, err := EncryptToAgent(agent.cert, []byte(bmcPassword))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecryptAsAgent(agent.key, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMTLSHandshake(b *testing.B) {
	now := time.Now()
	ca, _ := CreateCA("tls CA", now.Add(-time.Hour))
	certPEM, keyPEM, _ := ca.IssueServer([]string{"127.0.0.1"}, time.Hour, now)
	serverCfg, _ := ServerTLSConfig(ca, certPEM, keyPEM)
	serverCfg.SessionTicketsDisabled = true // full handshakes only
	node := issueAt(b, ca, NodeIdentity("n1", 1), time.Hour, now)
	cert, _ := TLSCertificate(node.cert, node.key)
	clientCfg := ClientTLSConfig(ca.CertPEM(), cert)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	results := make(chan bool)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(conn, serverCfg)
			err = tc.Handshake()
			st := tc.ConnectionState()
			_, ok := IdentityFromTLS(&st)
			if err == nil {
				_, err = tc.Write([]byte("k"))
			}
			tc.Close()
			results <- err == nil && ok
		}
	}()
	for b.Loop() {
		if err := dial(ln.Addr().String(), clientCfg); err != nil {
			b.Fatal(err)
		}
		if !<-results {
			b.Fatal("server did not see the node identity")
		}
	}
	ln.Close()
	<-done
}
