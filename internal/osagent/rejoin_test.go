package osagent

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
)

// lostAnswer is gateway.Identities as the control plane's: a one-time token is spent by the
// key of its first join, and that key (only) may join with it again (the answer was lost).
// The first join's answer is lost: lose runs (the machine loses power) and the join fails.
type lostAnswer struct {
	*gatewaytest.Identities
	ca   *pki.CA
	lose func()

	mu      sync.Mutex
	spentBy map[string][32]byte // token → hash of the key that spent it
	node    map[string]string   // token → node
}

func keyHash(csrDER []byte) ([32]byte, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(csr.RawSubjectPublicKeyInfo), nil
}

func (l *lostAnswer) JoinNode(ctx context.Context, token string, csrDER []byte, hints gateway.NodeHints) ([]byte, error) {
	kh, err := keyHash(csrDER)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if by, ok := l.spentBy[token]; ok {
		if by != kh {
			return nil, fmt.Errorf("token spent by another key: %w", gateway.ErrTokenRefused)
		}
		return l.ca.IssueNode(csrDER, l.node[token], 1, time.Hour, time.Now())
	}
	cert, err := l.Identities.JoinNode(ctx, token, csrDER, hints)
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(cert)
	if err != nil {
		return nil, err
	}
	id, err := pki.ParseIdentity(c)
	if err != nil {
		return nil, err
	}
	l.spentBy[token], l.node[token] = kh, id.NodeID
	l.lose()
	return nil, errors.New("the control plane crashed before answering")
}

// startGateway runs a gateway over ids on loopback until the test ends.
func startGateway(t *testing.T, ca *pki.CA, ids gateway.Identities) string {
	t.Helper()
	srv, err := gateway.New(gateway.Config{Queue: gatewaytest.NewQueue(), Identities: ids, CA: ca, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	path, h := srv.Handler()
	return gatewaytest.Serve(t, ca, path, h)
}

// A join the control plane recorded but whose answer never arrived (power lost, PID 1 died)
// is retried after the reboot with the same key, which the control plane accepts again: the
// key is on the state partition before the join. A new key would find the token spent and
// the node locked out until the instance is prepared again.
func TestRunRetriesALostJoinWithTheSameKeyAfterAReboot(t *testing.T) {
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	firstBoot := make(chan struct{})
	var once sync.Once
	ids := &lostAnswer{Identities: gatewaytest.NewIdentities(ca), ca: ca, spentBy: map[string][32]byte{}, node: map[string]string{},
		lose: func() { once.Do(func() { close(firstBoot) }) }}
	url := startGateway(t, ca, ids)
	token := ids.InstanceToken("n1", time.Hour)
	doc, _ := json.Marshal(Metadata{NodeID: "n1", Gateway: url, InstanceToken: token, CA: string(ca.CertPEM())})
	md, _ := metadataServer(t, 0, func() []byte { return doc })
	stateDir := filepath.Join(t.TempDir(), "state")
	kept := "bcd.state=partition bcd.metadata=" + md.URL + "/metadata"

	_, cancel, done := startRun(t, kept, DirState(stateDir))
	select {
	case <-firstBoot:
	case <-time.After(20 * time.Second):
		t.Fatal("the first boot never joined")
	}
	cancel() // the power goes
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil // for the first run's cleanup

	console, _, _ := startRun(t, kept, DirState(stateDir))
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(console.String(), MarkerJoined+" n1") {
		if strings.Contains(console.String(), "refused the instance token") || time.Now().After(deadline) {
			t.Fatalf("the rebooted OS did not join again with its key:\n%s", console)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A join key left on the state partition by an earlier attempt that a power loss damaged
// (FAT renames are not atomic) is replaced, not retried forever: without a certificate beside
// it, no identity is lost.
func TestRunReplacesADamagedPendingJoinKey(t *testing.T) {
	for name, content := range map[string][]byte{
		"garbage":   []byte("\x00\x00\x00"),
		"empty":     {},
		"truncated": []byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI"),
	} {
		t.Run(name, func(t *testing.T) {
			env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
			token := env.Identities.InstanceToken("n1", time.Hour)
			doc, _ := json.Marshal(Metadata{NodeID: "n1", Gateway: env.URL, InstanceToken: token, CA: string(env.CA.CertPEM())})
			md, _ := metadataServer(t, 0, func() []byte { return doc })
			stateDir := filepath.Join(t.TempDir(), "state")
			if err := os.MkdirAll(stateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(stateDir, agentlink.KeyFile), content, 0o600); err != nil {
				t.Fatal(err)
			}
			console, _, _ := startRun(t, "bcd.state=partition bcd.metadata="+md.URL+"/metadata", DirState(stateDir))
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(console.String(), MarkerJoined+" n1") {
				if strings.Count(console.String(), "cannot join") >= 3 || time.Now().After(deadline) {
					t.Fatalf("the OS did not join:\n%s", console)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// A kept certificate past its end by this machine's clock makes agentlink join again with the
// metadata's token; when that fails (the token is spent, or the clock is wrong, not the
// certificate), the identity stays: forgetting it would lock the node out for good once the
// clock is right again.
func TestRunKeepsAnExpiredIdentityWhenJoiningAgainFails(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
	key, csr, err := pki.NewKeyAndCSR("bcd os")
	if err != nil {
		t.Fatal(err)
	}
	// Valid for a nanosecond: the certificate's end, rounded down to its second, is past.
	certDER, err := env.CA.IssueNode(csr, "n1", 1, time.Nanosecond, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{agentlink.KeyFile: keyPEM, agentlink.CertFile: pki.EncodeCertPEM(certDER), agentlink.CAFile: env.CA.CertPEM()} {
		if err := os.WriteFile(filepath.Join(stateDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	spent, _, err := pki.NewToken(pki.InstanceTokenPrefix) // unknown to the gateway
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(Metadata{NodeID: "n1", Gateway: env.URL, InstanceToken: spent, CA: string(env.CA.CertPEM())})
	md, _ := metadataServer(t, 0, func() []byte { return doc })

	// The same with a damaged key beside it: unusable, forgotten (not retried for ever).
	damaged := filepath.Join(t.TempDir(), "damaged")
	if err := os.CopyFS(damaged, os.DirFS(stateDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(damaged, agentlink.KeyFile), []byte("-----BEGIN EC PRIVATE KEY-----\nMHcC"), 0o600); err != nil {
		t.Fatal(err)
	}
	console, _, _ := startRun(t, "bcd.state=partition bcd.metadata="+md.URL+"/metadata", DirState(damaged))
	waitConsole(t, console, "is unusable", 1)

	console, cancel, done := startRun(t, "bcd.state=partition bcd.metadata="+md.URL+"/metadata", DirState(stateDir))
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(console.String(), "joining again failed") < 3 {
		if strings.Contains(console.String(), "forgetting it") || time.Now().After(deadline) {
			t.Fatalf("the expired identity was not kept:\n%s", console)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil // for startRun's cleanup
	for _, name := range []string{agentlink.KeyFile, agentlink.CertFile, agentlink.CAFile} {
		if _, err := os.Stat(filepath.Join(stateDir, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
