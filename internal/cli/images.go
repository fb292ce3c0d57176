package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/catalog"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
)

func (g *globals) images() (bcdv1connect.ImageServiceClient, error) {
	c, err := g.clients()
	if err != nil {
		return nil, err
	}
	return c.images, nil
}

// readKey reads a base64 key file (as `bcd signer keygen` writes them).
func readKey(path string, size int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading key file: %w", err)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != size {
		return nil, usagef("key file %s: expected base64 of %d bytes (as bcd signer keygen writes)", path, size)
	}
	return k, nil
}

func signerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "signer", Short: "Ed25519 keys that sign catalog images"}
	keygen := &cobra.Command{Use: "keygen --out PREFIX", Short: "Make a key pair: PREFIX.key (private, 0600) and PREFIX.pub", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, _ := cmd.Flags().GetString("out")
			if out == "" {
				return usagef("--out PREFIX is required")
			}
			pub, key, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			if err := writeKeyPair(out, pub, key); err != nil {
				return err
			}
			fmt.Fprintf(g.env.Stdout, "wrote %s.key (keep it offline) and %s.pub\n", out, out)
			return nil
		}}
	keygen.Flags().String("out", "", "path prefix of the key files")
	add := &cobra.Command{Use: "add NAME --public-key-file FILE", Short: "Register a signer", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, _ := cmd.Flags().GetString("public-key-file")
			pub, err := readKey(file, ed25519.PublicKeySize)
			if err != nil {
				return err
			}
			c, err := g.images()
			if err != nil {
				return err
			}
			resp, err := c.AddSigner(cmd.Context(), connect.NewRequest(&bcdv1.AddSignerRequest{Signer: &bcdv1.Signer{Name: args[0], PublicKey: pub}}))
			if err != nil {
				return err
			}
			return g.done(resp.Msg, "signer "+args[0]+" registered")
		}}
	add.Flags().String("public-key-file", "", "the .pub file of bcd signer keygen")
	revoke := &cobra.Command{Use: "revoke NAME", Short: "Revoke a signer: its images can no longer be deployed", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.images()
			if err != nil {
				return err
			}
			resp, err := c.RevokeSigner(cmd.Context(), connect.NewRequest(&bcdv1.RevokeSignerRequest{Name: args[0]}))
			if err != nil {
				return err
			}
			return g.done(resp.Msg, "signer "+args[0]+" revoked: images it signed can no longer be deployed")
		}}
	list := &cobra.Command{Use: "list", Short: "List signers", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.images()
			if err != nil {
				return err
			}
			resp, err := c.ListSigners(cmd.Context(), connect.NewRequest(&bcdv1.ListSignersRequest{}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, s := range resp.Msg.Signers {
				rows = append(rows, []string{s.Name, base64.StdEncoding.EncodeToString(s.PublicKey), yesNo(s.Revoked)})
			}
			return g.table(resp.Msg, "NAME\tPUBLIC KEY\tREVOKED", rows)
		}}
	cmd.AddCommand(keygen, add, revoke, list)
	return cmd
}

// writeKeyPair writes PREFIX.key (0600) and PREFIX.pub, never over an existing file: a key
// replaced by mistake cannot sign for its registered signer again, and a file that existed
// keeps its mode (a private key written into a world-readable file).
func writeKeyPair(prefix string, pub ed25519.PublicKey, key ed25519.PrivateKey) error {
	for _, p := range []string{prefix + ".key", prefix + ".pub"} {
		if _, err := os.Lstat(p); err == nil {
			return usagef("%s exists: bcd signer keygen does not replace a key (choose another --out, or move it away)", p)
		}
	}
	for _, f := range []struct {
		path string
		b    []byte
		mode os.FileMode
	}{{prefix + ".key", key, 0o600}, {prefix + ".pub", pub, 0o644}} {
		w, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err == nil {
			_, err = io.WriteString(w, base64.StdEncoding.EncodeToString(f.b)+"\n")
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(f.path)
			}
		}
		if err != nil {
			if f.path != prefix+".key" {
				os.Remove(prefix + ".key") // half a pair is no pair
			}
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	return nil
}

func imageRows(imgs ...*bcdv1.Image) [][]string {
	var rows [][]string
	for _, i := range imgs {
		v := "deployable"
		if i.Verdict != "" {
			v = "REFUSED: " + i.Verdict
		}
		rows = append(rows, []string{i.Name, i.Format + "/" + i.Compression, fmt.Sprint(i.Size), dash(i.Signer), i.Url, v})
	}
	return rows
}

const imageHeader = "NAME\tFORMAT\tSIZE\tSIGNER\tURL\tVERDICT"

func imageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "The image catalog: only signed images are deployed"}
	var in bcdv1.Image
	var signKey, sigB64 string
	add := &cobra.Command{Use: "add NAME --url URL --sha256 HEX [--sign-key FILE --signer NAME]", Short: "Add (or replace) a catalog image, signing it locally with --sign-key", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Name = args[0]
			img := catalog.Image{Name: in.Name, URL: in.Url, Size: in.Size, Format: in.Format, Compression: in.Compression, SHA256: in.Sha256, SHA512: in.Sha512, Signer: in.Signer}
			if sigB64 != "" {
				if signKey != "" {
					return usagef("give --signature or --sign-key, not both")
				}
				sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sigB64))
				if err != nil || len(sig) != ed25519.SignatureSize {
					return usagef("--signature: expected base64 of a %d-byte Ed25519 signature (bcd image sign)", ed25519.SignatureSize)
				}
				in.Signature = sig
			}
			if signKey != "" {
				if in.Signer == "" {
					return usagef("--signer NAME is required with --sign-key")
				}
				key, err := readKey(signKey, ed25519.PrivateKeySize)
				if err != nil {
					return err
				}
				if err := catalog.Check(img); err != nil {
					return err
				}
				in.Signature = catalog.Sign(img, ed25519.PrivateKey(key)) // the private key never leaves this machine
			}
			c, err := g.images()
			if err != nil {
				return err
			}
			resp, err := c.AddImage(cmd.Context(), connect.NewRequest(&bcdv1.AddImageRequest{Image: &in}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, imageHeader, imageRows(resp.Msg.Image))
		}}
	f := add.Flags()
	f.StringVar(&in.Url, "url", "", "http(s) URL the site fetches the image from")
	f.Int64Var(&in.Size, "size", 0, "bytes the image writes to disk (decompressed; deploy.image checks it)")
	f.StringVar(&in.Format, "format", "raw", "raw, qcow2, iso or firmware (an iso or firmware: --compression none, a sha256; an iso is booted by media.insert, a firmware image installed by the BMC of a pool that names it in --firmware-image)")
	f.StringVar(&in.Compression, "compression", "none", "none, zstd, xz or gzip")
	f.StringVar(&in.Sha256, "sha256", "", "SHA-256 of the file at the URL (hex)")
	f.StringVar(&in.Sha512, "sha512", "", "SHA-512 of the file at the URL (hex)")
	f.StringVar(&in.Signer, "signer", "", "registered signer whose key signs it")
	f.StringVar(&signKey, "sign-key", "", "the signer's private key file (bcd signer keygen); used locally")
	f.StringVar(&sigB64, "signature", "", "a signature made elsewhere with bcd image sign (base64)")
	list := &cobra.Command{Use: "list", Short: "List catalog images and whether each is deployable", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.images()
			if err != nil {
				return err
			}
			resp, err := c.ListImages(cmd.Context(), connect.NewRequest(&bcdv1.ListImagesRequest{}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, imageHeader, imageRows(resp.Msg.Images...))
		}}
	cmd.AddCommand(add, list, imageSignCmd(g), imageVerifyCmd(g))
	return cmd
}

// imageSignCmd signs an image's catalog fields offline, where the private key lives; the
// signature goes to whoever runs `bcd image add --signature`.
func imageSignCmd(g *globals) *cobra.Command {
	var img catalog.Image
	var signKey string
	cmd := &cobra.Command{Use: "sign NAME --url URL --size N --sha256 HEX --signer NAME --sign-key FILE",
		Short: "Sign an image's catalog fields offline; prints the signature (base64) for image add --signature",
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			img.Name = args[0]
			if img.Signer == "" || signKey == "" {
				return usagef("--signer NAME and --sign-key FILE are required")
			}
			key, err := readKey(signKey, ed25519.PrivateKeySize)
			if err != nil {
				return err
			}
			if err := catalog.Check(img); err != nil {
				return err
			}
			fmt.Fprintln(g.env.Stdout, base64.StdEncoding.EncodeToString(catalog.Sign(img, ed25519.PrivateKey(key))))
			return nil
		}}
	f := cmd.Flags()
	f.StringVar(&img.URL, "url", "", "http(s) URL the site fetches the image from")
	f.Int64Var(&img.Size, "size", 0, "bytes the image writes to disk (decompressed)")
	f.StringVar(&img.Format, "format", "raw", "raw, qcow2, iso or firmware (an iso or firmware: --compression none, a sha256)")
	f.StringVar(&img.Compression, "compression", "none", "none, zstd, xz or gzip")
	f.StringVar(&img.SHA256, "sha256", "", "SHA-256 of the file at the URL (hex)")
	f.StringVar(&img.SHA512, "sha512", "", "SHA-512 of the file at the URL (hex)")
	f.StringVar(&img.Signer, "signer", "", "the signer's registered name")
	f.StringVar(&signKey, "sign-key", "", "the signer's private key file (bcd signer keygen)")
	return cmd
}

// imageVerifyCmd checks, on the operator's side, a catalog image's signature against the
// registered signers (and, with --file, that a local copy has the catalogued digest).
func imageVerifyCmd(g *globals) *cobra.Command {
	var file string
	cmd := &cobra.Command{Use: "verify NAME [--file PATH]", Short: "Verify a catalog image's signature here (and a local file's digest)",
		Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.images()
			if err != nil {
				return err
			}
			imgs, err := c.ListImages(cmd.Context(), connect.NewRequest(&bcdv1.ListImagesRequest{}))
			if err != nil {
				return err
			}
			signers, err := c.ListSigners(cmd.Context(), connect.NewRequest(&bcdv1.ListSignersRequest{}))
			if err != nil {
				return err
			}
			var found *bcdv1.Image
			for _, i := range imgs.Msg.Images {
				if i.Name == args[0] {
					found = i
				}
			}
			if found == nil {
				return fmt.Errorf("image %q is not in the catalog (bcd image list)", args[0])
			}
			img := catalog.Image{Name: found.Name, URL: found.Url, Size: found.Size, Format: found.Format, Compression: found.Compression,
				SHA256: found.Sha256, SHA512: found.Sha512, Signer: found.Signer, Signature: found.Signature}
			var ss []catalog.Signer
			for _, s := range signers.Msg.Signers {
				ss = append(ss, catalog.Signer{Name: s.Name, PublicKey: s.PublicKey, Revoked: s.Revoked})
			}
			if err := catalog.Verify(img, ss); err != nil {
				return fmt.Errorf("image %s does not verify: %w", img.Name, err)
			}
			fmt.Fprintf(g.env.Stdout, "image %s: signature by %s verifies\n", img.Name, img.Signer)
			if file == "" {
				return nil
			}
			return verifyFileDigest(g.env.Stdout, g.env.Stderr, file, img)
		}}
	cmd.Flags().StringVar(&file, "file", "", "a local copy of the file at the image's URL: its digest must match the catalog")
	return cmd
}

// verifyFileDigest checks a local copy's digests against the catalog's. An image is gigabytes:
// progress goes to status (stderr) about once a second.
func verifyFileDigest(w, status io.Writer, path string, img catalog.Image) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	var size int64
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	h256, h512 := sha256.New(), sha512.New()
	p := &hashProgress{w: status, path: path, size: size}
	if _, err := io.Copy(io.MultiWriter(h256, h512, p), f); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	p.report()
	fmt.Fprintln(status)
	if img.SHA256 != "" && hex.EncodeToString(h256.Sum(nil)) != img.SHA256 {
		return fmt.Errorf("%s: sha256 %s differs from the catalog's %s", path, hex.EncodeToString(h256.Sum(nil)), img.SHA256)
	}
	if img.SHA512 != "" && hex.EncodeToString(h512.Sum(nil)) != img.SHA512 {
		return fmt.Errorf("%s: sha512 differs from the catalog's", path)
	}
	fmt.Fprintf(w, "%s: digest matches the catalog\n", path)
	return nil
}

// hashProgress counts the bytes hashed and reports them, at most once a second.
type hashProgress struct {
	w    io.Writer
	path string
	size int64
	done int64
	last time.Time
}

func (p *hashProgress) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if time.Since(p.last) >= time.Second {
		p.report()
	}
	return len(b), nil
}

func (p *hashProgress) report() {
	p.last = time.Now()
	if p.size > 0 {
		fmt.Fprintf(p.w, "\rhashing %s: %d of %d MiB (%d%%)", p.path, p.done>>20, p.size>>20, 100*p.done/p.size)
		return
	}
	fmt.Fprintf(p.w, "\rhashing %s: %d MiB", p.path, p.done>>20)
}
