package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"bcd/internal/catalog"
)

// PutSigner registers a signer's Ed25519 public key (a name is registered once).
func (t *Tx) PutSigner(ctx context.Context, name string, pub []byte) error {
	if _, err := t.exec(ctx, `INSERT INTO signers (name, public_key, created_at) VALUES (?, ?, ?)`, name, pub, t.at); err != nil {
		if isUnique(err) {
			return fmt.Errorf("signer %q: %w", name, ErrConflict)
		}
		return fmt.Errorf("registering signer %s: %w", name, err)
	}
	return nil
}

// RevokeSigner revokes a signer: images it signed are no longer deployable.
func (t *Tx) RevokeSigner(ctx context.Context, name string) error {
	res, err := t.exec(ctx, `UPDATE signers SET revoked_at = ? WHERE name = ? AND revoked_at = 0`, t.at, name)
	if err != nil {
		return fmt.Errorf("revoking signer %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("active signer %q: %w", name, ErrNotFound)
	}
	return nil
}

// Signers lists every signer (revoked ones included, marked).
func (s *Store) Signers(ctx context.Context) ([]catalog.Signer, error) {
	rows, err := s.queryRows(ctx, `SELECT name, public_key, revoked_at FROM signers ORDER BY name`)
	return collect(rows, err, "signers", scanSigner)
}

// PutImage adds or replaces a catalog image.
func (t *Tx) PutImage(ctx context.Context, img catalog.Image) error {
	_, err := t.exec(ctx, `INSERT INTO images (name, url, size, format, compression, sha256, sha512, signer, signature, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET url = excluded.url, size = excluded.size,
		format = excluded.format, compression = excluded.compression, sha256 = excluded.sha256, sha512 = excluded.sha512,
		signer = excluded.signer, signature = excluded.signature`,
		img.Name, img.URL, img.Size, img.Format, img.Compression, img.SHA256, img.SHA512, img.Signer, img.Signature, t.at)
	if err != nil {
		return fmt.Errorf("storing image %s: %w", img.Name, err)
	}
	return nil
}

func scanSigner(r interface{ Scan(...any) error }) (catalog.Signer, error) {
	var sg catalog.Signer
	var revoked int64
	err := r.Scan(&sg.Name, &sg.PublicKey, &revoked)
	sg.Revoked = revoked != 0
	return sg, err
}

const imageCols = `name, url, size, format, compression, sha256, sha512, signer, signature`

func scanImage(r interface{ Scan(...any) error }) (catalog.Image, error) {
	var img catalog.Image
	err := r.Scan(&img.Name, &img.URL, &img.Size, &img.Format, &img.Compression, &img.SHA256, &img.SHA512, &img.Signer, &img.Signature)
	return img, err
}

// Image reads a catalog image.
func (s *Store) Image(ctx context.Context, name string) (catalog.Image, error) {
	img, err := scanImage(s.queryRow(ctx, `SELECT `+imageCols+` FROM images WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.Image{}, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return catalog.Image{}, fmt.Errorf("reading image %q: %w", name, err)
	}
	return img, nil
}

// Images lists the catalog.
func (s *Store) Images(ctx context.Context) ([]catalog.Image, error) {
	rows, err := s.queryRows(ctx, `SELECT `+imageCols+` FROM images ORDER BY name`)
	return collect(rows, err, "images", scanImage)
}

// imageCopy is img with a signature of its own (the writer keeps images it read).
func imageCopy(img catalog.Image) catalog.Image {
	img.Signature = slices.Clone(img.Signature)
	return img
}

// VerifiedImage (in a transaction) returns a catalog image only when its signature still
// verifies.
func (t *Tx) VerifiedImage(ctx context.Context, name string) (catalog.Image, error) {
	// SQLite's writer keeps the image's row and its signer's rows as read until a statement
	// changes their table (a revoked signer is read again); the signature is checked each time.
	rc := t.rows()
	var img catalog.Image
	if v, ok := rc.memo(memoImages, name); ok {
		img = imageCopy(v.(catalog.Image))
	} else {
		var err error
		img, err = scanImage(t.queryRow(ctx, `SELECT `+imageCols+` FROM images WHERE name = ?`, name))
		if errors.Is(err, sql.ErrNoRows) {
			return catalog.Image{}, fmt.Errorf("image %q: %w", name, ErrNotFound)
		}
		if err != nil {
			return catalog.Image{}, err
		}
		rc.remember(memoImages, name, imageCopy(img))
	}
	var signers []catalog.Signer
	if v, ok := rc.memo(memoSigners, img.Signer); ok {
		signers = slices.Clone(v.([]catalog.Signer))
	} else {
		rows, err := t.query(ctx, `SELECT name, public_key, revoked_at FROM signers WHERE name = ?`, img.Signer)
		if signers, err = collect(rows, err, "signers", scanSigner); err != nil {
			return catalog.Image{}, err
		}
		rc.remember(memoSigners, img.Signer, slices.Clone(signers))
	}
	if err := catalog.VerifyRemembering(img, signers, t.s.imageSigs); err != nil {
		return catalog.Image{}, err
	}
	return img, nil
}

// VerifiedImage returns a catalog image only when its signature still verifies against the
// registered signers (unsigned, revoked-signer and tampered images are refused).
func (s *Store) VerifiedImage(ctx context.Context, name string) (catalog.Image, error) {
	img, err := s.Image(ctx, name)
	if err != nil {
		return catalog.Image{}, err
	}
	signers, err := s.Signers(ctx)
	if err != nil {
		return catalog.Image{}, err
	}
	if err := catalog.VerifyRemembering(img, signers, s.imageSigs); err != nil {
		return catalog.Image{}, err
	}
	return img, nil
}

// Discovery is a MAC a site agent saw PXE-booting with no boot entry. Inventory is what a
// discovery-mode ramdisk on that machine reported (self-asserted JSON, "" when none);
// Acceptance is the operator's decision on it ("", accepted, rejected) and NodeID the node an
// acceptance enrolled.
type Discovery struct {
	SiteID, MAC, UUID, Arch, AgentID string
	FirstSeen, LastSeen              int64
	Inventory, Acceptance, NodeID    string
	DecidedBy                        string
}

// Acceptance decisions on a discovered machine.
const (
	AcceptancePending  = ""
	AcceptanceAccepted = "accepted"
	AcceptanceRejected = "rejected"
)

const discoveryCols = `site_id, mac, uuid, arch, agent_id, first_seen, last_seen, inventory, acceptance, node_id, decided_by`

func scanDiscovery(r interface{ Scan(...any) error }) (Discovery, error) {
	var d Discovery
	err := r.Scan(&d.SiteID, &d.MAC, &d.UUID, &d.Arch, &d.AgentID, &d.FirstSeen, &d.LastSeen, &d.Inventory, &d.Acceptance, &d.NodeID, &d.DecidedBy)
	return d, err
}

// RecordDiscovered upserts what a site agent reported seeing (first seen kept, last seen
// advanced, an inventory kept until a newer one arrives).
func (t *Tx) RecordDiscovered(ctx context.Context, d Discovery) error {
	_, err := t.exec(ctx, `INSERT INTO discovered (site_id, mac, uuid, arch, agent_id, first_seen, last_seen, inventory) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (site_id, mac) DO UPDATE SET uuid = CASE WHEN excluded.uuid = '' THEN discovered.uuid ELSE excluded.uuid END,
		arch = excluded.arch, agent_id = excluded.agent_id,
		first_seen = CASE WHEN excluded.first_seen < discovered.first_seen THEN excluded.first_seen ELSE discovered.first_seen END,
		last_seen = CASE WHEN excluded.last_seen > discovered.last_seen THEN excluded.last_seen ELSE discovered.last_seen END,
		inventory = CASE WHEN excluded.inventory = '' THEN discovered.inventory ELSE excluded.inventory END`,
		d.SiteID, d.MAC, d.UUID, d.Arch, d.AgentID, d.FirstSeen, d.LastSeen, d.Inventory)
	if err != nil {
		return fmt.Errorf("recording discovered MAC %s: %w", d.MAC, err)
	}
	return nil
}

// Discovered lists a site's discoveries whose MAC belongs to no node, most recent first.
func (s *Store) Discovered(ctx context.Context, siteID string, limit int) ([]Discovery, error) {
	rows, err := s.queryRows(ctx, `SELECT `+discoveryCols+` FROM discovered
		WHERE site_id = ? AND mac NOT IN (SELECT mac FROM node_macs) ORDER BY last_seen DESC LIMIT ?`, siteID, limit)
	return collect(rows, err, "discovered machines", scanDiscovery)
}
