package openfiles

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	cases := []struct {
		name   string
		cur    Limit
		need   uint64
		next   Limit
		change bool
	}{
		{"enough", Limit{20000, 20000}, 20000, Limit{20000, 20000}, false},
		{"more than enough", Limit{1024, 4096}, 100, Limit{1024, 4096}, false},
		{"soft raised within the hard limit", Limit{1024, 524288}, 31024, Limit{31024, 524288}, true},
		{"hard raised too", Limit{20000, 20000}, 31024, Limit{31024, 31024}, true},
		{"soft below, hard exactly the need", Limit{1024, 4096}, 4096, Limit{4096, 4096}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next, change := plan(c.cur, c.need)
			if next != c.next || change != c.change {
				t.Fatalf("plan(%+v, %d) = %+v, %v; want %+v, %v", c.cur, c.need, next, change, c.next, c.change)
			}
		})
	}
}

func TestEnsure(t *testing.T) {
	ctx, log := context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil))
	orig, err := get()
	if err != nil {
		t.Fatal(err)
	}
	if orig.Hard < 64 {
		t.Skipf("a hard limit of %d open files leaves nothing to test", orig.Hard)
	}
	t.Cleanup(func() { _ = set(Limit{Soft: orig.Soft, Hard: orig.Hard}) })
	// Lowered first, so that raising it again stays within the hard limit (no privilege).
	half := min(orig.Hard/2, 1<<15) // an unlimited hard limit is more than the kernel allows
	if err := set(Limit{Soft: half, Hard: orig.Hard}); err != nil {
		t.Fatal(err)
	}

	got, err := Ensure(ctx, log, half-1)
	if err != nil || got != (Limit{half, orig.Hard}) {
		t.Fatalf("a need below the limit: %+v, %v; want the limit unchanged", got, err)
	}
	got, err = Ensure(ctx, log, half+10)
	if err != nil || got.Soft != half+10 {
		t.Fatalf("a need within the hard limit: %+v, %v; want the soft limit raised to %d", got, err, half+10)
	}
	if now, _ := get(); now != got {
		t.Fatalf("the process's limit is %+v, Ensure said %+v", now, got)
	}

	// Beyond the kernel's ceiling no process may go, privileged or not: the error says
	// what was needed and what the limit is, and the limit stays.
	huge := uint64(1) << 40
	before, _ := get()
	_, err = Ensure(ctx, log, huge)
	if err == nil {
		t.Fatalf("a need of %d open files was granted", huge)
	}
	for _, want := range []string{strconv.FormatUint(huge, 10), strconv.FormatUint(before.Soft, 10), "ulimit -n"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if now, _ := get(); now != before {
		t.Fatalf("a refused raise changed the limit from %+v to %+v", before, now)
	}

	// Above the hard limit: granted where the process may raise it (root), refused otherwise;
	// either way what Ensure answers is the process's limit.
	got, err = Ensure(ctx, log, orig.Hard+1)
	now, _ := get()
	if now != got {
		t.Fatalf("the process's limit is %+v, Ensure said %+v (error %v)", now, got, err)
	}
	if err == nil && got.Soft < orig.Hard+1 {
		t.Fatalf("a raise above the hard limit reported success at %+v", got)
	}
}
