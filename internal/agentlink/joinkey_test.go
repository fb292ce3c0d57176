package agentlink

import (
	"crypto/ecdsa"
	"os"
	"path/filepath"
	"testing"
)

// An agent with no identity yet joins with a key already on disk: an attempt after a join whose
// answer was lost uses the same key (the control plane accepts a retry with it), and the file is
// the agent's alone.
func TestPendingJoinKeySurvivesALostAnswer(t *testing.T) {
	dir := t.TempDir()
	first, err := pendingJoinKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, err := pendingJoinKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Public().(*ecdsa.PublicKey).Equal(again.Public()) {
		t.Fatal("a second join attempt made a new key")
	}
	if _, ok, err := loadIdentity(dir); ok || err != nil {
		t.Fatalf("a join key alone is not an identity: %v %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pendingJoinKey(dir); err == nil {
		t.Fatal("a damaged key file was accepted")
	}
}
