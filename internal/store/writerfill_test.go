package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestGroupWaits(t *testing.T) {
	for _, tc := range []struct {
		last, n int
		want    bool
	}{
		{0, 1, false},                      // idle: a lone write runs at once
		{fillAfter - 1, 1, false},          // the last group was small: no load
		{fillAfter, 1, true},               // under load, a small group waits
		{maxGroup, fillTo - 1, true},       // still short of fillTo
		{fillAfter, fillTo, false},         // full enough
		{maxGroup, maxGroup, false},        // full
		{fillAfter - 1, fillTo - 1, false}, // no load, however many came at once
	} {
		if got := groupWaits(tc.last, tc.n); got != tc.want {
			t.Errorf("groupWaits(last %d, %d): %v, want %v", tc.last, tc.n, got, tc.want)
		}
	}
}

// Under load (the last group was large) the writer lets a group fill: writes that come while it
// waits are committed with the first, in one group. Idle, a lone write does not wait. (The
// wait is lengthened to a minute: a write that waited would outlast the test's deadline.)
func TestWriterLetsAGroupFillUnderLoad(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	s.fillNs.Store(int64(time.Minute))
	insert := func(name string) func(*Tx) error {
		return func(tx *Tx) error {
			_, err := tx.InsertTenant(ctx, name)
			return err
		}
	}
	within := func(what string, done <-chan struct{}) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: not committed after 30s (the writer waited for more writes)", what)
		}
	}

	// Under load: the first write waits for fillTo-1 more, sent after it.
	s.lastGroup.Store(fillTo)
	before := s.WriterStats().Groups
	var wg sync.WaitGroup
	for i := range fillTo {
		wg.Go(func() {
			if err := s.Write(ctx, insert(fmt.Sprintf("t%d", i))); err != nil {
				t.Error(err)
			}
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	within("a full group under load", all)
	if got := s.WriterStats().Groups - before; got != 1 {
		t.Errorf("%d writes sent one after the other under load were committed in %d groups, want 1", fillTo, got)
	}

	// Idle (the last group was small): a lone write is committed at once.
	s.lastGroup.Store(1)
	lone := make(chan struct{})
	go func() {
		defer close(lone)
		if err := s.Write(ctx, insert("lone")); err != nil {
			t.Error(err)
		}
	}()
	within("a lone write on an idle store", lone)
}
