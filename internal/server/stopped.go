package server

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"bcd/internal/engine"
	"bcd/internal/store"
)

// StoppedStore is a store opened for work done with every server on it stopped (a restore's
// fence, a sealing-key rotation).
type StoppedStore struct {
	*store.Store
	// Engine and Target are the DSN's parts: Target names a SQLite file (a PostgreSQL DSN may
	// hold a password: never print it).
	Engine store.Engine
	Target string
	// PeerTimeout is how recent a server's heartbeat shows it running on a PostgreSQL store;
	// 0 on SQLite, whose lock (held until Close) shows no server runs and keeps one from
	// starting.
	PeerTimeout time.Duration
	lock        io.Closer
}

// Close closes the store, then lets servers start on it.
func (s *StoppedStore) Close() error {
	err := s.Store.Close()
	if s.lock != nil {
		if lerr := s.lock.Close(); err == nil {
			err = lerr
		}
	}
	return err
}

// OpenStopped opens the existing store cfg names (cfg with its defaults). A SQLite store must
// exist: opening would create an empty one, and a mistyped path is not a store to work on;
// missing says what to do then. Its lock is taken, or the error says a server holds it.
func OpenStopped(ctx context.Context, cfg Config, missing string) (*StoppedStore, error) {
	eng, target, err := store.ParseDSN(cfg.StoreDSN)
	if err != nil {
		return nil, err
	}
	if eng == store.SQLite {
		if _, err := os.Stat(target); err != nil {
			return nil, fmt.Errorf("no SQLite store at %s (%s): %w", target, missing, err)
		}
	}
	lock, err := store.LockSQLite(cfg.StoreDSN)
	if err != nil {
		return nil, err
	}
	s := &StoppedStore{Engine: eng, Target: target, lock: lock}
	if lock == nil {
		if s.PeerTimeout = cfg.Engine.PeerTimeout; s.PeerTimeout <= 0 {
			s.PeerTimeout = engine.DefaultPeerTimeout
		}
	}
	if s.Store, err = store.Open(ctx, cfg.StoreDSN); err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	return s, nil
}
