package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImageSignOfflineAndVerify: a signature made offline with `image sign` is accepted by
// `image add --signature`; `image verify` checks it against the registered signers and a local
// file's digest; a tampered field or file is refused.
func TestImageSignOfflineAndVerify(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	dir := t.TempDir()
	prefix := filepath.Join(dir, "signer")
	if code, _, errs := run(t, env, "signer", "keygen", "--out", prefix); code != 0 {
		t.Fatalf("keygen: %s", errs)
	}
	if code, _, errs := run(t, env, "signer", "add", "release", "--public-key-file", prefix+".pub"); code != 0 {
		t.Fatalf("signer add: %s", errs)
	}
	file := filepath.Join(dir, "os.img")
	content := []byte(strings.Repeat("bcd image ", 1000))
	if err := os.WriteFile(file, content, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	fields := []string{"--url", "http://images.example/os.img", "--size", strconv.Itoa(len(content)), "--sha256", digest, "--signer", "release"}

	code, sig, errs := run(t, env, append([]string{"image", "sign", "os", "--sign-key", prefix + ".key"}, fields...)...)
	if code != 0 || strings.TrimSpace(sig) == "" {
		t.Fatalf("image sign: %d %q %q", code, sig, errs)
	}
	if code, out, errs := run(t, env, append([]string{"image", "add", "os", "--signature", strings.TrimSpace(sig)}, fields...)...); code != 0 || !strings.Contains(out, "deployable") {
		t.Fatalf("image add --signature: %d %q %q", code, out, errs)
	}
	if code, out, errs := run(t, env, "image", "verify", "os", "--file", file); code != 0 || !strings.Contains(out, "verifies") || !strings.Contains(out, "digest matches") {
		t.Fatalf("image verify: %d %q %q", code, out, errs)
	}

	// The same signature over a changed field is refused by the server; a changed file by verify.
	tampered := append([]string{"image", "add", "os2", "--signature", strings.TrimSpace(sig)}, fields...)
	if code, out, errs := run(t, env, tampered...); code != 0 || !strings.Contains(out, "REFUSED: os2 (signer release): image's signature does not verify") {
		t.Errorf("a signature made for another name: %d %q %q, want the image catalogued as refused", code, out, errs)
	}
	if code, _, errs := run(t, env, "image", "verify", "os2"); code == 0 || !strings.Contains(errs, "does not verify") {
		t.Errorf("verify of the tampered image: %d %q", code, errs)
	}
	if err := os.WriteFile(file, append(content, '!'), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run(t, env, "image", "verify", "os", "--file", file); code == 0 || !strings.Contains(errs, "differs from the catalog") {
		t.Errorf("verify of a changed file: %d %q", code, errs)
	}
	if code, _, errs := run(t, env, "image", "verify", "missing"); code == 0 || !strings.Contains(errs, "not in the catalog") {
		t.Errorf("verify of an unknown image: %d %q", code, errs)
	}
}
