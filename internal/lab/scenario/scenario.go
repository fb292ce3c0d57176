// Package scenario drives the lab's VMs through their life against a control plane, over its
// public API only, as an operator would: sign and register the lab OS image, enroll each VM by
// its virtual BMC, and move the nodes from verb to verb while watching their progress. The demo
// (`bcd lab demo`) shows it; the end-to-end test asserts it.
package scenario

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/catalog"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/lab"
	"bcd/internal/lab/osimage"
)

// Client is the public API as the scenario uses it.
type Client struct {
	Nodes     bcdv1connect.NodeServiceClient
	Inventory bcdv1connect.InventoryServiceClient
	Images    bcdv1connect.ImageServiceClient
	// streams is Nodes without the calls' one-minute bound: console sessions last longer.
	streams bcdv1connect.NodeServiceClient
}

// NewClient talks to the API at baseURL (http://host:port) with a bearer token.
func NewClient(baseURL, token string) *Client {
	hc := &http.Client{Timeout: time.Minute}
	base := strings.TrimSuffix(baseURL, "/")
	opt := connect.WithInterceptors(bearer(token))
	return &Client{
		Nodes:     bcdv1connect.NewNodeServiceClient(hc, base, opt),
		Inventory: bcdv1connect.NewInventoryServiceClient(hc, base, opt),
		Images:    bcdv1connect.NewImageServiceClient(hc, base, opt),
		streams:   bcdv1connect.NewNodeServiceClient(&http.Client{}, base, opt),
	}
}

// bearer sends the token with every call, unary and streaming.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// ConsoleWatch is a read-only console session that keeps what the machine writes.
type ConsoleWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	out    bytes.Buffer
	err    error
}

// WatchConsole opens node's serial console read-only and returns once a site agent relays it
// (within ctx); from then on it keeps what the machine writes, until Stop or the session's end.
func (c *Client) WatchConsole(ctx context.Context, node, reason string) (*ConsoleWatch, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s, err := c.streams.Console(sctx, connect.NewRequest(&bcdv1.ConsoleRequest{Node: node, Reason: reason, ReadOnly: true}))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening the console of %s: %w", node, err)
	}
	w := &ConsoleWatch{cancel: cancel, done: make(chan struct{})}
	connected := make(chan struct{})
	go func() {
		defer close(w.done)
		once := sync.OnceFunc(func() { close(connected) })
		for s.Receive() {
			m := s.Msg()
			if strings.HasPrefix(m.Status, "connected") {
				once()
			}
			w.mu.Lock()
			w.out.Write(m.Data)
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.err = s.Err()
		w.mu.Unlock()
		s.Close()
	}()
	select {
	case <-connected:
		return w, nil
	case <-w.done:
		cancel()
		return nil, fmt.Errorf("the console of %s ended before a site agent relayed it: %v", node, w.err)
	case <-ctx.Done():
		cancel()
		<-w.done
		return nil, fmt.Errorf("the console of %s: no site agent relayed it: %w", node, ctx.Err())
	}
}

// Stop ends the session and returns what the machine wrote.
func (w *ConsoleWatch) Stop() string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// JoinToken mints a site agent's one-time join token and writes it to path (0600). It returns
// the control plane's CA (PEM), which the site agent must trust.
func (c *Client) JoinToken(ctx context.Context, site, path string) ([]byte, error) {
	resp, err := c.Inventory.CreateSiteJoinToken(ctx, connect.NewRequest(&bcdv1.CreateSiteJoinTokenRequest{Site: site}))
	if err != nil {
		return nil, fmt.Errorf("minting a join token for site %s: %w", site, err)
	}
	if err := os.WriteFile(path, []byte(resp.Msg.Token+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing the join token: %w", err)
	}
	return []byte(resp.Msg.CaPem), nil
}

// Image is a catalog image to register, signed locally with Key by Signer.
type Image struct {
	catalog.Image
	Key ed25519.PrivateKey
}

// AddSignedImage registers the image's signer (its public key) unless it is registered, and the
// image with its signature: only signed images are deployed.
func (c *Client) AddSignedImage(ctx context.Context, img Image) error {
	pub, ok := img.Key.Public().(ed25519.PublicKey)
	if !ok || len(img.Key) != ed25519.PrivateKeySize {
		return errors.New("registering image: the signing key is not an Ed25519 private key")
	}
	signers, err := c.Images.ListSigners(ctx, connect.NewRequest(&bcdv1.ListSignersRequest{}))
	if err != nil {
		return fmt.Errorf("listing signers: %w", err)
	}
	known := false
	for _, s := range signers.Msg.Signers {
		if s.Name == img.Signer {
			known = true
		}
	}
	if !known {
		if _, err := c.Images.AddSigner(ctx, connect.NewRequest(&bcdv1.AddSignerRequest{Signer: &bcdv1.Signer{Name: img.Signer, PublicKey: pub}})); err != nil {
			return fmt.Errorf("registering signer %s: %w", img.Signer, err)
		}
	}
	if err := catalog.Check(img.Image); err != nil {
		return fmt.Errorf("registering image %s: %w", img.Name, err)
	}
	in := &bcdv1.Image{Name: img.Name, Url: img.URL, Size: img.Size, Format: img.Format, Compression: img.Compression,
		Sha256: img.SHA256, Sha512: img.SHA512, Signer: img.Signer, Signature: catalog.Sign(img.Image, img.Key)}
	resp, err := c.Images.AddImage(ctx, connect.NewRequest(&bcdv1.AddImageRequest{Image: in}))
	if err != nil {
		return fmt.Errorf("registering image %s: %w", img.Name, err)
	}
	if v := resp.Msg.Image.GetVerdict(); v != "" {
		return fmt.Errorf("image %s registered but not deployable: %s", img.Name, v)
	}
	return nil
}

// Driver is how a VM is enrolled: by its Redfish or its IPMI BMC.
type Driver string

const (
	Redfish Driver = "redfish"
	IPMI    Driver = "ipmi"
)

// DriverFor alternates: VM 0 by Redfish, VM 1 by IPMI, and so on, so a lab of two exercises both.
func DriverFor(i int) Driver {
	if i%2 == 1 {
		return IPMI
	}
	return Redfish
}

// EnrollInput is the enroll request for vm: Redfish with the BMC's certificate pinned, or IPMI
// with the provisioning MAC and product UUID the operator read off the machine (an IPMI BMC does
// not report its host's MACs). Pure.
func EnrollInput(vm lab.VMState, cred lab.Credential, d Driver, pool string) *bcdv1.EnrollRequest {
	req := &bcdv1.EnrollRequest{Name: vm.Name, Pool: pool, Reason: "lab"}
	switch d {
	case IPMI:
		req.Bmc = &bcdv1.BmcCredentials{Driver: string(IPMI), Address: vm.IPMIAddr, Username: cred.Username, Password: cred.Password}
		req.Macs, req.ProductUuid = []string{vm.MAC}, vm.UUID
	default:
		req.Bmc = &bcdv1.BmcCredentials{Driver: string(Redfish), Address: vm.RedfishURL, Username: cred.Username, Password: cred.Password,
			TlsFingerprintSha256: vm.RedfishFingerprint}
	}
	return req
}

// Enrolled is a lab VM as a node.
type Enrolled struct {
	VM     lab.VMState
	Driver Driver
	NodeID string
}

// EnrollLab enrolls every VM of the lab into pool (DriverFor picks the BMC).
func (c *Client) EnrollLab(ctx context.Context, st lab.State, creds lab.Credentials, pool string) ([]Enrolled, error) {
	return c.EnrollLabInto(ctx, st, creds, func(int) string { return pool })
}

// EnrollLabInto enrolls VM i of the lab into pool(i) (DriverFor picks the BMC).
func (c *Client) EnrollLabInto(ctx context.Context, st lab.State, creds lab.Credentials, pool func(i int) string) ([]Enrolled, error) {
	var out []Enrolled
	for i, vm := range st.VMs {
		cred, ok := creds.For(vm.Name)
		if !ok {
			return nil, fmt.Errorf("enrolling %s: no credential in %s", vm.Name, st.Credentials)
		}
		d := DriverFor(i)
		resp, err := c.Nodes.Enroll(ctx, connect.NewRequest(EnrollInput(vm, cred, d, pool(i))))
		if err != nil {
			return nil, fmt.Errorf("enrolling %s by %s: %w", vm.Name, d, err)
		}
		out = append(out, Enrolled{VM: vm, Driver: d, NodeID: resp.Msg.Node.Id})
	}
	return out, nil
}

// FailedError is a node that went to failed while the scenario waited for it.
type FailedError struct{ Node *bcdv1.Node }

func (e *FailedError) Error() string {
	n := e.Node
	return fmt.Sprintf("node %s failed (from %s): %s %s", n.Name, n.FailedFrom, n.FaultCode, n.FaultMessage)
}

// Wait polls the nodes (Get, with their activity) until every one rests in state want, calling
// view with each round's nodes. A node in failed ends the wait with a *FailedError.
func (c *Client) Wait(ctx context.Context, ids []string, want string, view func([]*bcdv1.Node)) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		nodes := make([]*bcdv1.Node, 0, len(ids))
		done := 0
		for _, id := range ids {
			resp, err := c.Nodes.Get(ctx, connect.NewRequest(&bcdv1.GetNodeRequest{Node: id}))
			if err != nil {
				return fmt.Errorf("watching node %s: %w", id, err)
			}
			n := resp.Msg.Node
			nodes = append(nodes, n)
			if n.State == "failed" && want != "failed" {
				if view != nil {
					view(nodes)
				}
				return &FailedError{Node: n}
			}
			if n.State == want && n.TargetState == "" {
				done++
			}
		}
		if view != nil {
			view(nodes)
		}
		if done == len(ids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for nodes to rest in %s: %w", want, ctx.Err())
		case <-tick.C:
		}
	}
}

// Verb applies one of the simple verbs (provide, rescue, unrescue, …) or deploy/undeploy.
func (c *Client) Verb(ctx context.Context, verb, node, image string) error {
	var err error
	r := &bcdv1.NodeVerbRequest{Node: node, Reason: "lab scenario"}
	switch verb {
	case "deploy":
		_, err = c.Nodes.Deploy(ctx, connect.NewRequest(&bcdv1.DeployRequest{Node: node, Image: image, Reason: r.Reason}))
	case "undeploy":
		_, err = c.Nodes.Undeploy(ctx, connect.NewRequest(&bcdv1.UndeployRequest{Node: node, Reason: r.Reason}))
	case "rescue":
		_, err = c.Nodes.Rescue(ctx, connect.NewRequest(r))
	case "unrescue":
		_, err = c.Nodes.Unrescue(ctx, connect.NewRequest(r))
	case "provide":
		_, err = c.Nodes.Provide(ctx, connect.NewRequest(r))
	case "manage":
		_, err = c.Nodes.Manage(ctx, connect.NewRequest(r))
	case "inspect":
		_, err = c.Nodes.Inspect(ctx, connect.NewRequest(r))
	default:
		return fmt.Errorf("verb %q: accepted are deploy, undeploy, rescue, unrescue, provide, manage, inspect", verb)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, node, err)
	}
	return nil
}

// LabImage reads the lab OS image's manifest in dir (`make lab-image`: out/lab) and its signer's
// key, for an image served at shareURL (the lab's file share: the site agent's ramdisks stream it
// from there).
func LabImage(dir, shareURL string) (Image, osimage.Manifest, error) {
	var m osimage.Manifest
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return Image{}, m, fmt.Errorf("reading the lab image manifest (make lab-image): %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return Image{}, m, fmt.Errorf("decoding %s: %w", filepath.Join(dir, "manifest.json"), err)
	}
	_, key, err := osimage.EnsureSigner(filepath.Join(dir, m.SignerKeyFile), filepath.Join(dir, m.SignerPubFile))
	if err != nil {
		return Image{}, m, err
	}
	img := catalog.Image{Name: m.Name, URL: strings.TrimSuffix(shareURL, "/") + "/" + m.File, Size: m.Size, Format: m.Format,
		Compression: m.Compression, SHA256: m.SHA256, Signer: m.Signer}
	return Image{Image: img, Key: key}, m, nil
}
