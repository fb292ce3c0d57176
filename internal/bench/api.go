// Package bench measures the control plane over its real API: enroll throughput with concurrent
// clients, then listings of every node. It reports figures; it asserts nothing about time.
package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
)

// APIConfig says what to run.
type APIConfig struct {
	BaseURL, Token string
	// TLS is the clients' TLS for an https:// BaseURL (nil: the system's CAs); each
	// connection's transport takes a copy (HTTP/2 adds to a transport's own).
	TLS            *tls.Config
	Nodes, Clients int
	Pool           string
	Progress       func(done, total int)
}

// APIResult holds the figures.
type APIResult struct {
	Nodes          int           `json:"nodes"`
	Clients        int           `json:"clients"`
	EnrollTotal    time.Duration `json:"enrollTotalNs"`
	EnrollPerSec   float64       `json:"enrollPerSec"`
	EnrollP50      time.Duration `json:"enrollP50Ns"`
	EnrollP99      time.Duration `json:"enrollP99Ns"`
	ListPaged      time.Duration `json:"listPagedNs"`
	ListPagedPages int           `json:"listPagedPages"`
	ListOnePage    time.Duration `json:"listOnePageNs"`
	GetOne         time.Duration `json:"getOneNs"`
}

func (r APIResult) String() string {
	return fmt.Sprintf("enroll: %d nodes with %d clients in %s = %.0f nodes/s (p50 %s, p99 %s)\nlist: all %d nodes in %d pages of 500: %s; in one page (median of 5): %s\nget one node: %s",
		r.Nodes, r.Clients, r.EnrollTotal.Round(time.Millisecond), r.EnrollPerSec, r.EnrollP50.Round(time.Microsecond), r.EnrollP99.Round(time.Microsecond),
		r.Nodes, r.ListPagedPages, r.ListPaged.Round(time.Millisecond), r.ListOnePage.Round(time.Millisecond), r.GetOne.Round(time.Microsecond))
}

func bearer(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}
}

// RunAPI enrolls cfg.Nodes nodes with cfg.Clients concurrent clients (each its own connection),
// then lists them all paged and in one page, then gets one.
func RunAPI(ctx context.Context, cfg APIConfig) (APIResult, error) {
	if cfg.Pool == "" {
		cfg.Pool = "default"
	}
	res := APIResult{Nodes: cfg.Nodes, Clients: cfg.Clients}
	run := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)
	lat := make([]time.Duration, cfg.Nodes)
	var next, done atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for c := range cfg.Clients {
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, TLSClientConfig: cfg.TLS.Clone(), ForceAttemptHTTP2: true}}
		client := bcdv1connect.NewNodeServiceClient(hc, cfg.BaseURL, connect.WithInterceptors(bearer(cfg.Token)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Nodes || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				_, err := client.Enroll(ctx, connect.NewRequest(&bcdv1.EnrollRequest{
					Name: fmt.Sprintf("b%s-%06d", run, i), Pool: cfg.Pool,
					Macs:   []string{fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", c, (i>>24)&0xff, (i>>16)&0xff, (i>>8)&0xff, i&0xff)},
					Labels: map[string]string{"rack": fmt.Sprintf("r%d", i%40)},
					Bmc:    &bcdv1.BmcCredentials{Address: fmt.Sprintf("https://10.%d.%d.%d", (i>>16)&0xff, (i>>8)&0xff, i&0xff), Username: "root", Password: "bench-password"},
				}))
				lat[i] = time.Since(t0)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("enrolling node %d: %w", i, err) })
					return
				}
				if d := int(done.Add(1)); cfg.Progress != nil && d%500 == 0 {
					cfg.Progress(d, cfg.Nodes)
				}
			}
		}()
	}
	wg.Wait()
	res.EnrollTotal = time.Since(start)
	if firstErr != nil {
		return res, firstErr
	}
	res.EnrollPerSec = float64(cfg.Nodes) / res.EnrollTotal.Seconds()
	slices.Sort(lat)
	res.EnrollP50 = lat[len(lat)/2]
	res.EnrollP99 = lat[len(lat)*99/100]

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg.TLS.Clone(), ForceAttemptHTTP2: true}}
	client := bcdv1connect.NewNodeServiceClient(hc, cfg.BaseURL, connect.WithInterceptors(bearer(cfg.Token)))
	t0 := time.Now()
	tok, total := "", 0
	for {
		resp, err := client.List(ctx, connect.NewRequest(&bcdv1.ListNodesRequest{PageSize: 500, PageToken: tok}))
		if err != nil {
			return res, fmt.Errorf("listing page %d: %w", res.ListPagedPages, err)
		}
		res.ListPagedPages++
		total += len(resp.Msg.Nodes)
		if tok = resp.Msg.NextPageToken; tok == "" {
			break
		}
	}
	res.ListPaged = time.Since(t0)
	if total < cfg.Nodes {
		return res, fmt.Errorf("paged listing returned %d nodes, want at least %d", total, cfg.Nodes)
	}
	// The one-page listing is repeated: the figure is the median of five.
	var resp *connect.Response[bcdv1.ListNodesResponse]
	var one []time.Duration
	for range 5 {
		t0 = time.Now()
		var err error
		resp, err = client.List(ctx, connect.NewRequest(&bcdv1.ListNodesRequest{PageSize: 10000}))
		if err != nil {
			return res, fmt.Errorf("listing in one page: %w", err)
		}
		one = append(one, time.Since(t0))
	}
	slices.Sort(one)
	res.ListOnePage = one[len(one)/2]
	if len(resp.Msg.Nodes) < min(cfg.Nodes, 10000) {
		return res, fmt.Errorf("one-page listing returned %d nodes", len(resp.Msg.Nodes))
	}
	t0 = time.Now()
	if _, err := client.Get(ctx, connect.NewRequest(&bcdv1.GetNodeRequest{Node: resp.Msg.Nodes[len(resp.Msg.Nodes)/2].Id})); err != nil {
		return res, fmt.Errorf("getting a node: %w", err)
	}
	res.GetOne = time.Since(t0)
	return res, nil
}
