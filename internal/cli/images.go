package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/catalog"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
)

func (g *globals) images() (bcdv1connect.ImageServiceClient, error) {
	if _, err := g.clients(); err != nil {
		return nil, err
	}
	return bcdv1connect.NewImageServiceClient(httpClient(), strings.TrimSuffix(g.server, "/"), connect.WithInterceptors(bearer(g.apiToken()))), nil
}

// readKey reads a base64 key file (as `bcd signer keygen` writes them).
func readKey(path string, size int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading key file: %w", err)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != size {
		return nil, fmt.Errorf("key file %s: expected base64 of %d bytes (as bcd signer keygen writes)", path, size)
	}
	return k, nil
}

func signerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "signer", Short: "Ed25519 keys that sign catalog images"}
	keygen := &cobra.Command{Use: "keygen --out PREFIX", Short: "Make a key pair: PREFIX.key (private, 0600) and PREFIX.pub", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, _ := cmd.Flags().GetString("out")
			if out == "" {
				return fmt.Errorf("--out PREFIX is required")
			}
			pub, key, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			if err := os.WriteFile(out+".key", []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
				return err
			}
			if err := os.WriteFile(out+".pub", []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(g.env.Stdout, "wrote %s.key (keep it offline) and %s.pub\n", out, out)
			return nil
		}}
	keygen.Flags().String("out", "", "path prefix of the key files")
	add := &cobra.Command{Use: "add NAME --public-key-file FILE", Short: "Register a signer", Args: cobra.ExactArgs(1),
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
			_, err = c.AddSigner(cmd.Context(), connect.NewRequest(&bcdv1.AddSignerRequest{Signer: &bcdv1.Signer{Name: args[0], PublicKey: pub}}))
			return err
		}}
	add.Flags().String("public-key-file", "", "the .pub file of bcd signer keygen")
	revoke := &cobra.Command{Use: "revoke NAME", Short: "Revoke a signer: its images can no longer be deployed", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.images()
			if err != nil {
				return err
			}
			_, err = c.RevokeSigner(cmd.Context(), connect.NewRequest(&bcdv1.RevokeSignerRequest{Name: args[0]}))
			return err
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
	var signKey string
	add := &cobra.Command{Use: "add NAME --url URL --sha256 HEX [--sign-key FILE --signer NAME]", Short: "Add (or replace) a catalog image, signing it locally with --sign-key", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Name = args[0]
			img := catalog.Image{Name: in.Name, URL: in.Url, Size: in.Size, Format: in.Format, Compression: in.Compression, SHA256: in.Sha256, SHA512: in.Sha512, Signer: in.Signer}
			if signKey != "" {
				if in.Signer == "" {
					return fmt.Errorf("--signer NAME is required with --sign-key")
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
	f.StringVar(&in.Format, "format", "raw", "raw or qcow2")
	f.StringVar(&in.Compression, "compression", "none", "none, zstd, xz or gzip")
	f.StringVar(&in.Sha256, "sha256", "", "SHA-256 of the file at the URL (hex)")
	f.StringVar(&in.Sha512, "sha512", "", "SHA-512 of the file at the URL (hex)")
	f.StringVar(&in.Signer, "signer", "", "registered signer whose key signs it")
	f.StringVar(&signKey, "sign-key", "", "the signer's private key file (bcd signer keygen); used locally")
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
	cmd.AddCommand(add, list)
	return cmd
}
