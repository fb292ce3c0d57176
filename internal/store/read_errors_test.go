package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A read that fails says what it was reading (an operator's log line, an API error), and keeps
// the cause for errors.Is.
func TestReadErrorsSayWhatWasRead(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		cases := []struct {
			want string
			read func() error
		}{
			{"reading command c1", func() error { _, err := st.Command(ctx, "c1"); return err }},
			{`reading image "img"`, func() error { _, err := st.Image(ctx, "img"); return err }},
			{`reading tenant "tn"`, func() error { _, err := st.Tenant(ctx, "tn"); return err }},
			{`reading site "s1"`, func() error { _, err := st.Site(ctx, "s1"); return err }},
			{`reading pool "p1"`, func() error { _, err := st.Pool(ctx, "p1"); return err }},
			{"reading secret x1", func() error { _, err := st.Sealed(ctx, "x1"); return err }},
			{"reading token", func() error { _, err := st.TokenByHash(ctx, []byte("h")); return err }},
		}
		for _, c := range cases {
			t.Run(c.want, func(t *testing.T) {
				err := c.read()
				if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, context.Canceled) {
					t.Errorf("error %v: want one that says %q and wraps context.Canceled", err, c.want)
				}
			})
		}
	})
}
