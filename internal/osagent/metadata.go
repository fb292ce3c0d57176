package osagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"bcd/internal/osagent/osjoin"
)

// Metadata is the site agent's /metadata document for a deployed node (osjoin.Metadata: the
// site agent's rejoin endpoint reads the same document).
type Metadata = osjoin.Metadata

// ErrNotPublished is a 404 from the metadata endpoint: the control plane has not prepared this
// node's instance (yet), or the site agent does not know this address.
var ErrNotPublished = errors.New("metadata not published for this address (404)")

const maxMetadata = 64 << 10

// ParseMetadata decodes and checks a metadata document (osjoin.ParseMetadata).
func ParseMetadata(b []byte) (Metadata, error) { return osjoin.ParseMetadata(b) }

// FetchMetadata GETs the document once: ErrNotPublished on 404, another error on anything but
// 200 or a bad document.
func FetchMetadata(ctx context.Context, c *http.Client, u string) (Metadata, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Metadata{}, fmt.Errorf("reading metadata: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return Metadata{}, fmt.Errorf("reading metadata: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadata+1))
	if err != nil {
		return Metadata{}, fmt.Errorf("reading metadata: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return Metadata{}, ErrNotPublished
	case resp.StatusCode != http.StatusOK:
		return Metadata{}, fmt.Errorf("reading metadata: HTTP %d", resp.StatusCode)
	case len(body) > maxMetadata:
		return Metadata{}, fmt.Errorf("reading metadata: document larger than %d bytes", maxMetadata)
	}
	return ParseMetadata(body)
}
