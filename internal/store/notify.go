package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ChannelName is the PostgreSQL name of the store's channel name: channels belong to the
// database, and several stores (schemas) may share one.
func (s *Store) ChannelName(name string) string { return name + "_" + s.channelTag }

// Notify publishes payloads on channel to every server listening to it on this store
// (PostgreSQL's NOTIFY, in one statement). On SQLite, whose store has one server, it does
// nothing.
func (s *Store) Notify(ctx context.Context, channel string, payloads ...string) error {
	if s.engine != Postgres || len(payloads) == 0 {
		return nil
	}
	if _, err := s.write.ExecContext(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, s.ChannelName(channel), payloads); err != nil {
		return fmt.Errorf("notifying %d payloads on %s: %w", len(payloads), channel, err)
	}
	return nil
}

// Listen calls f with every payload published on channel (Notify, from any server), on a
// connection of its own, until ctx ends (nil) or the connection fails (its error). What is
// published while nobody listens is not kept. On SQLite it waits for ctx.
func (s *Store) Listen(ctx context.Context, channel string, f func(payload string)) error {
	if s.engine != Postgres {
		<-ctx.Done()
		return nil
	}
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("connecting to listen on %s: %w", channel, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.ChannelName(channel)}.Sanitize()); err != nil {
		return fmt.Errorf("listening on %s: %w", channel, err)
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("waiting for notices on %s: %w", channel, err)
		}
		f(n.Payload)
	}
}
