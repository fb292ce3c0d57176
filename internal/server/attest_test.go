package server_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/server"
)

// checkOffline verifies an attestation as an auditor without bcd would, from the API's answer
// alone and the standard library: the node's certificate chains to the agent CA at the time the
// result arrived, the signing input ends with the SHA-256 of the result, and the signature over
// SHA-256(signing input) is the certificate key's.
func checkOffline(caPEM string, a *bcdv1.Attestation) error {
	block, _ := pem.Decode([]byte(caPEM))
	if block == nil {
		return errors.New("no CA certificate")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	if block, _ = pem.Decode([]byte(a.SignerCertPem)); block == nil {
		return errors.New("no signer certificate")
	}
	signer, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	at, err := time.Parse(time.RFC3339Nano, a.FinishedAt)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := signer.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("signer certificate: %w", err)
	}
	digest := sha256.Sum256([]byte(a.Result))
	if !bytes.HasSuffix(a.SigningInput, digest[:]) {
		return errors.New("the signing input does not end with the SHA-256 of the result")
	}
	if !bytes.Contains(a.SigningInput, []byte(a.CommandId)) || !bytes.Contains(a.SigningInput, []byte(a.Kind)) {
		return errors.New("the signing input does not name the command and its kind")
	}
	pub, ok := signer.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return errors.New("the signer's key is not ECDSA")
	}
	signed := sha256.Sum256(a.SigningInput)
	if !ecdsa.VerifyASN1(pub, signed[:], a.Signature) {
		return errors.New("the signature does not verify")
	}
	return nil
}

// checkAttestations: the API lists the node's attested results, every one verified by the
// control plane (the commissioning's wipe too, signed under an identity generation the release
// has revoked since) and verifiable offline from the answer alone; an altered result is not.
func checkAttestations(t *testing.T, ctx context.Context, srv *server.Server, node string, wantWipes int) {
	t.Helper()
	auth := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			r.Header().Set("Authorization", "Bearer "+srv.FirstAdminToken())
			return next(ctx, r)
		}
	}))
	nodes := bcdv1connect.NewNodeServiceClient(http.DefaultClient, srv.URL(), auth)
	all, err := nodes.Attestations(ctx, connect.NewRequest(&bcdv1.ListAttestationsRequest{Node: node}))
	if err != nil {
		t.Fatal(err)
	}
	wipes, err := nodes.Attestations(ctx, connect.NewRequest(&bcdv1.ListAttestationsRequest{Node: node, Kind: "disk.wipe"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(wipes.Msg.Attestations); got != wantWipes {
		t.Fatalf("%d wipe attestations, want %d", got, wantWipes)
	}
	if len(all.Msg.Attestations) <= wantWipes {
		t.Fatalf("%d attestations in all, want the wipes and the diagnostics", len(all.Msg.Attestations))
	}
	gens := map[uint64]bool{}
	for _, a := range all.Msg.Attestations {
		if !a.Verified {
			t.Errorf("%s %s not verified by the control plane: %s", a.Kind, a.CommandId, a.VerifyError)
		}
		if err := checkOffline(all.Msg.CaPem, a); err != nil {
			t.Errorf("%s %s does not verify offline: %v", a.Kind, a.CommandId, err)
		}
		altered := proto.Clone(a).(*bcdv1.Attestation)
		altered.Result = strings.Replace(a.Result, "true", "false", 1) + " "
		if checkOffline(all.Msg.CaPem, altered) == nil {
			t.Errorf("%s %s: an altered result verifies offline", a.Kind, a.CommandId)
		}
		gens[a.Generation] = true
	}
	if !gens[1] || !gens[2] {
		t.Errorf("attested generations %v, want the commissioning's (1) and the release's (2)", gens)
	}
	if _, err := nodes.Attestations(ctx, connect.NewRequest(&bcdv1.ListAttestationsRequest{Node: node, Kind: "bmc.power"})); connect.CodeOf(err) != connect.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "accepted are diag.dcgm, disk.wipe") {
		t.Errorf("an unattested kind: %v", err)
	}
}
