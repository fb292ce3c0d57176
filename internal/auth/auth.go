// Package auth holds API roles, what each may do, and the bearer-token format. Tokens are
// random, shown once, and stored only as their SHA-256.
package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"bcd/internal/pki"
)

// Role is what a token may do, within its tenant (or every tenant when the token has none).
type Role string

const (
	Admin    Role = "admin"
	Operator Role = "operator"
	Approver Role = "approver"
	Viewer   Role = "viewer"
)

// Roles lists every role.
var roles = []Role{Admin, Operator, Approver, Viewer}

// ParseRole validates s.
func ParseRole(s string) (Role, error) {
	if slices.Contains(roles, Role(s)) {
		return Role(s), nil
	}
	return "", fmt.Errorf("unknown role %q: accepted are admin, operator, approver, viewer", s)
}

// Permission is a class of API call.
type Permission string

const (
	Read       Permission = "read"       // get, list, events
	Operate    Permission = "operate"    // enroll and every verb on nodes
	Approve    Permission = "approve"    // approve or reject destructive batches
	Administer Permission = "administer" // tenants, sites, pools, profiles, tokens
)

// grants is the role table.
var grants = map[Role][]Permission{
	Admin:    {Read, Operate, Approve, Administer},
	Operator: {Read, Operate},
	Approver: {Read, Approve},
	Viewer:   {Read},
}

// Allows reports whether role r grants p.
func Allows(r Role, p Permission) bool { return slices.Contains(grants[r], p) }

// Principal is the caller of an API request.
type Principal struct {
	TokenID  string
	Name     string
	Role     Role
	TenantID string // empty: every tenant
}

// Actor is how the principal appears in events.
func (p Principal) Actor() string { return "token:" + p.Name }

// CanSeeTenant reports whether the principal may act in tenant id. A principal without a known
// role sees no tenant: the zero Principal (no token was checked) has an empty TenantID too,
// which must not read as "every tenant".
func (p Principal) CanSeeTenant(id string) bool {
	return slices.Contains(roles, p.Role) && (p.TenantID == "" || p.TenantID == id)
}

type ctxKey struct{}

// WithPrincipal attaches p to ctx.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal of ctx.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// TokenPrefix starts every API token, so they are recognisable in a leaked file.
const TokenPrefix = pki.APITokenPrefix

// NewToken returns a new bearer token and the hash to store.
func NewToken() (plain string, hash []byte, err error) { return pki.NewToken(TokenPrefix) }

// HashToken is the stored form of a token.
func HashToken(plain string) []byte { return pki.HashToken(plain) }

// ParseBearer extracts the token of an Authorization header value.
func ParseBearer(header string) (string, error) {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	tok = strings.TrimSpace(tok)
	if !ok || tok == "" {
		return "", fmt.Errorf("missing bearer token: send the header \"Authorization: Bearer %s…\"", TokenPrefix)
	}
	if !strings.HasPrefix(tok, TokenPrefix) || len(tok) > 128 {
		return "", fmt.Errorf("malformed bearer token: bcd tokens start with %q", TokenPrefix)
	}
	return tok, nil
}
