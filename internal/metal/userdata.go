package metal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"bcd/internal/store"
	"bcd/internal/workflow"
)

// MaxUserData bounds the operator user-data of a deploy (cloud-init's own NoCloud limit is
// larger; 64 KiB is what a config drive and most clouds take).
const MaxUserData = 64 << 10

// Guests of boot.kexec that read operator user-data (docs/drivers/cloud-init.md).
const (
	GuestCloudInit = "cloud-init"
	GuestIgnition  = "ignition"
)

// cloudInitHeaders are the first lines by which cloud-init recognises a user-data part
// (cloud-init's "user data formats"); a MIME multipart archive starts with its Content-Type
// header. Pure.
func cloudInitHeaders() []string {
	return []string{"#cloud-config", "#!", "#include", "#cloud-boothook", "## template: jinja", "Content-Type:"}
}

// CheckUserData checks that b is user-data the guest reads: guest is what reads it in the deploy
// profile (workflow.UserDataGuest; "" or "none": an image that reads none). Pure; the error never quotes b
// (it may hold secrets).
func CheckUserData(guest string, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if len(b) > MaxUserData {
		return invalid("userData", "is %d bytes: at most %d (64 KiB) are accepted", len(b), MaxUserData)
	}
	switch guest {
	case GuestCloudInit:
		return checkCloudInit(b)
	case GuestIgnition:
		return checkIgnition(b)
	case "", "none":
		return invalid("userData", "the deploy profile's boot.kexec has no guest (it boots an image that runs bcd itself, which reads no user-data): user-data needs a profile whose boot.kexec has guest cloud-init or ignition, or that writes a config drive (deploy.configDrive)")
	}
	return invalid("userData", "the deploy profile's boot.kexec guest %q reads no user-data: accepted are guests cloud-init and ignition", truncate(guest))
}

func checkCloudInit(b []byte) error {
	if !utf8.Valid(b) {
		return invalid("userData", "is not UTF-8 text: cloud-init user-data is text starting with one of %s (gzip is not accepted)", strings.Join(cloudInitHeaders(), ", "))
	}
	var header string
	for _, h := range cloudInitHeaders() {
		if bytes.HasPrefix(b, []byte(h)) {
			header = h
			break
		}
	}
	if header == "" {
		return invalid("userData", "does not start with a header cloud-init reads: accepted are %s", strings.Join(cloudInitHeaders(), ", "))
	}
	if header != "#cloud-config" {
		return nil
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return invalid("userData", "is #cloud-config but not valid YAML: %s", yamlProblem(err))
	}
	if _, ok := doc.(map[string]any); !ok && doc != nil {
		return invalid("userData", "is #cloud-config but its YAML is a %s, not a mapping (e.g. \"ssh_authorized_keys: [...]\")", yamlKind(doc))
	}
	return nil
}

// yamlProblem is the YAML parser's message without any quoted text of the document: only
// its line ("yaml: line 3: ...") survives, the rest is generic.
func yamlProblem(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "line "); i >= 0 {
		if j := strings.Index(msg[i:], ":"); j > 0 {
			return msg[i:i+j] + ": a syntax error"
		}
	}
	return "a syntax error"
}

func yamlKind(v any) string {
	switch v.(type) {
	case []any:
		return "list"
	case string:
		return "string"
	default:
		return "scalar"
	}
}

func checkIgnition(b []byte) error {
	var cfg struct {
		Ignition *struct {
			Version string `json:"version"`
		} `json:"ignition"`
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return invalid("userData", "is not a JSON object: an Ignition guest takes an Ignition config ({\"ignition\": {\"version\": \"3.x.y\"}, …}; Butane output)")
	}
	if err := json.Unmarshal(b, &cfg); err != nil || cfg.Ignition == nil {
		return invalid("userData", "has no ignition object with a version: an Ignition guest takes an Ignition config ({\"ignition\": {\"version\": \"3.x.y\"}, …})")
	}
	if !strings.HasPrefix(cfg.Ignition.Version, "3.") {
		return invalid("userData", "ignition.version is not a spec 3 version: accepted are 3.x.y (Flatcar and Fedora CoreOS read 3.0.0 to 3.5.0)")
	}
	return nil
}

// deployGuest is what reads the user-data in the deploy profile name as the reconciler will
// resolve it: its boot.kexec guest, else cloud-init where it writes a config drive, else "".
func (s *Service) deployGuest(ctx context.Context, tx *store.Tx, name string) (string, error) {
	p, err := s.deployProfile(ctx, tx, name)
	if err != nil {
		return "", err
	}
	res, err := workflow.Resolve(p, map[string]string{"image": "x", "wipe": "quick"})
	if err != nil {
		return "", invalid("profile", "%s", err.Error())
	}
	return workflow.UserDataGuest(res.Steps), nil
}

// deployProfile is the deploy profile name as the reconciler will resolve it: an operator
// profile stored through the API first, then the server's, then the built-in ones.
func (s *Service) deployProfile(ctx context.Context, tx *store.Tx, name string) (workflow.Profile, error) {
	def, ok, err := tx.Profile(ctx, name)
	if err != nil {
		return workflow.Profile{}, err
	}
	if ok && !workflow.Overridable(name) {
		p, err := workflow.ParseProfile(name, []byte(def))
		if err != nil {
			return workflow.Profile{}, invalid("profile", "%s", err.Error())
		}
		return p, nil
	}
	p, err := workflow.Find(name, s.profiles)
	if err != nil {
		return workflow.Profile{}, invalid("profile", "%s", err.Error())
	}
	return p, nil
}

// sealUserData checks b against the guest of the deploy profile and seals it for n's tenant:
// what the node row keeps. Empty b: none (the zero value).
func (s *Service) sealUserData(ctx context.Context, tx *store.Tx, n store.Node, profile string, b []byte) (store.UserData, error) {
	if len(b) == 0 {
		return store.UserData{}, nil
	}
	guest, err := s.deployGuest(ctx, tx, profile)
	if err != nil {
		return store.UserData{}, err
	}
	if err := CheckUserData(guest, b); err != nil {
		return store.UserData{}, fmt.Errorf("deploy profile %s: %w", profile, err)
	}
	ref, err := s.seal(ctx, tx, n.TenantID, string(b))
	if err != nil {
		return store.UserData{}, fmt.Errorf("sealing user-data: %w", err)
	}
	sum := sha256.Sum256(b)
	return store.UserData{Ref: ref, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}, nil
}
