package cli

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --allocsprofile writes, at the run's end, the heap's allocations profile: gzip'd protobuf
// whose sample types include alloc_space, the figure go tool pprof -sample_index=alloc_space
// reads; a path that cannot be created is refused before the run, saying what it was.
func TestAllocsProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allocs.pprof")
	var errs strings.Builder
	stop, err := startAllocsProfile(path, &errs)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if errs.Len() > 0 {
		t.Fatalf("writing the profile said %q", errs.String())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the profile is not gzip'd (%v): not what go tool pprof reads", err)
	}
	body, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(body, []byte("alloc_space")) {
		t.Errorf("the profile (%d bytes) has no alloc_space sample type: not an allocations profile", len(body))
	}

	if _, err := startAllocsProfile(filepath.Join(t.TempDir(), "missing", "allocs.pprof"), &errs); err == nil || !strings.Contains(err.Error(), "allocations profile") {
		t.Errorf("a profile in a missing directory: error %v, want one about the allocations profile", err)
	}
	if stop, err := startAllocsProfile("", &errs); err != nil {
		t.Errorf("no path: %v, want nothing to do", err)
	} else {
		stop()
	}
}
