package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"bcd/internal/secrets"
)

// The store's side of the sealing keyring (secrets.CheckStore, secrets.Rotate): the sealed
// values are the secrets' rows and the installation CA's keys (sealed_key, next_sealed_key).

// SealedKeyGroups groups the secrets by the key their sealed value names (secrets.Magic and the
// key id after it; legacy values, without, make one group), with the smallest and the largest
// id of each as samples, and adds the installation CA's sealed keys, grouped the same way. One
// scan of the secrets, one read per sample.
func (s *Store) SealedKeyGroups(ctx context.Context) ([]secrets.SealedGroup, error) {
	type group struct {
		minID, maxID string
		n            int
	}
	rows, err := s.queryRows(ctx, `SELECT MIN(id), MAX(id), COUNT(*) FROM (
		SELECT id, CASE WHEN substr(sealed, 1, ?) = ? THEN substr(sealed, ?, ?) END AS k FROM secrets) g
		GROUP BY k`, len(secrets.Magic), []byte(secrets.Magic), len(secrets.Magic)+1, secrets.KeyIDSize)
	groups, err := collect(rows, err, "secrets by sealing key", func(r interface{ Scan(...any) error }) (group, error) {
		var g group
		return g, r.Scan(&g.minID, &g.maxID, &g.n)
	})
	if err != nil {
		return nil, err
	}
	var out []secrets.SealedGroup
	for _, g := range groups {
		sg := secrets.SealedGroup{What: "secrets", Count: g.n}
		for _, id := range []string{g.minID, g.maxID} {
			if len(sg.Samples) > 0 && id == sg.Samples[0].ID {
				continue
			}
			sealed, err := s.Sealed(ctx, id)
			if errors.Is(err, ErrNotFound) {
				continue // deleted meanwhile
			}
			if err != nil {
				return nil, err
			}
			sg.Samples = append(sg.Samples, secrets.SealedValue{ID: id, Sealed: sealed})
		}
		out = append(out, sg)
	}
	var key, next []byte
	err = s.queryRow(ctx, `SELECT sealed_key, next_sealed_key FROM installation_ca WHERE id = 1`).Scan(&key, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the installation CA's sealed keys: %w", err)
	}
	// The CA's keys (the active one, and the staged one if any), by the key they name.
	byKey := map[string]int{} // key id → index in out
	for _, sealed := range [][]byte{key, next} {
		if len(sealed) == 0 {
			continue
		}
		k := secrets.KeyIDOf(sealed)
		if i, ok := byKey[k]; ok {
			out[i].Count++
			out[i].Samples = append(out[i].Samples, secrets.SealedValue{ID: CASealID, Sealed: sealed})
			continue
		}
		byKey[k] = len(out)
		out = append(out, secrets.SealedGroup{What: "agent CA keys", Count: 1, Samples: []secrets.SealedValue{{ID: CASealID, Sealed: sealed}}})
	}
	return out, nil
}

// SecretCount is the number of secrets.
func (s *Store) SecretCount(ctx context.Context) (int, error) {
	var n int
	if err := s.queryRow(ctx, `SELECT COUNT(*) FROM secrets`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting secrets: %w", err)
	}
	return n, nil
}

// ResealSecrets passes, in one transaction, over at most limit secrets whose id is after after
// ("": from the first), in id order, and stores what reseal returns for each (nil: the row is
// left alone). It returns the last id passed ("": none was left), how many it passed and how
// many it changed; an error of reseal rolls the whole batch back.
func (s *Store) ResealSecrets(ctx context.Context, after string, limit int, reseal secrets.ResealFunc) (last string, seen, changed int, err error) {
	if limit <= 0 {
		return "", 0, 0, fmt.Errorf("re-sealing secrets: a batch of %d rows: give at least 1", limit)
	}
	err = s.Write(ctx, func(tx *Tx) error {
		last, seen, changed = "", 0, 0
		rows, err := tx.query(ctx, `SELECT id, sealed FROM secrets WHERE id > ? ORDER BY id LIMIT ?`+tx.forUpdate(), after, limit)
		batch, err := collect(rows, err, "secrets to re-seal", func(r interface{ Scan(...any) error }) (secrets.SealedValue, error) {
			var v secrets.SealedValue
			return v, r.Scan(&v.ID, &v.Sealed)
		})
		if err != nil {
			return err
		}
		for _, v := range batch {
			out, err := reseal(v.ID, v.Sealed)
			if err != nil {
				return err
			}
			seen, last = seen+1, v.ID
			if out == nil {
				continue
			}
			if err := tx.execLater(ctx, "re-sealing secret "+v.ID, `UPDATE secrets SET sealed = ? WHERE id = ?`, out, v.ID); err != nil {
				return err
			}
			changed++
		}
		return nil
	})
	if err != nil {
		return "", 0, 0, err
	}
	return last, seen, changed, nil
}

// ResealCA passes, in one transaction, over the installation CA's sealed keys (the active one,
// and the staged next one if any), sealed for CASealID, and stores what reseal returns (nil:
// left alone). A change bumps the row's version, as every change of it does: a server that
// read it before writes nothing over it (ErrStale).
func (s *Store) ResealCA(ctx context.Context, reseal secrets.ResealFunc) (changed int, err error) {
	err = s.Write(ctx, func(tx *Tx) error {
		changed = 0
		var key, next []byte
		var version int64
		err := tx.queryRow(ctx, `SELECT sealed_key, next_sealed_key, version FROM installation_ca WHERE id = 1`+tx.forUpdate()).Scan(&key, &next, &version)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the installation CA's sealed keys: %w", err)
		}
		newKey, err := reseal(CASealID, key)
		if err != nil {
			return err
		}
		if newKey != nil {
			key = newKey
			changed++
		}
		var nextArg any
		if len(next) > 0 {
			newNext, err := reseal(CASealID, next)
			if err != nil {
				return err
			}
			if newNext != nil {
				next = newNext
				changed++
			}
			nextArg = next
		}
		if changed == 0 {
			return nil
		}
		res, err := tx.exec(ctx, `UPDATE installation_ca SET sealed_key = ?, next_sealed_key = ?, version = version + 1, changed_at = ? WHERE id = 1 AND version = ?`,
			key, nextArg, tx.at, version)
		if err != nil {
			return fmt.Errorf("re-sealing the installation CA's keys: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("re-sealing the installation CA's keys: %w", err)
		} else if n == 0 {
			return fmt.Errorf("re-sealing the installation CA's keys (version %d): %w", version, ErrStale)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return changed, nil
}
