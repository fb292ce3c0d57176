package pki

// Error is the type of this package's sentinel errors. They are constants (nothing at package
// level can be reassigned); errors.Is matches them by value.
type Error string

func (e Error) Error() string { return string(e) }

// Sentinel errors. Every refusal of this package wraps exactly one of them, so callers can
// record why with errors.Is (e.g. a command's attestation_error column).
const (
	// ErrBadIdentity: an identity or its URI SAN is malformed or missing.
	ErrBadIdentity Error = "bad identity"
	// ErrBadCSR: a certificate signing request cannot be parsed, its signature does not verify,
	// or its key is not ECDSA P-256.
	ErrBadCSR Error = "bad certificate request"
	// ErrBadInput: an argument (ID, TTL, host, prefix…) is out of bounds.
	ErrBadInput Error = "bad input"

	// ErrUnknownCA: a certificate was not issued by this CA.
	ErrUnknownCA Error = "certificate not issued by this CA"
	// ErrCertExpired: a certificate is expired or not yet valid at the time of the check.
	ErrCertExpired Error = "certificate expired or not yet valid"
	// ErrCertInvalid: a certificate does not parse or fails verification for another reason.
	ErrCertInvalid Error = "invalid certificate"

	// ErrBadSignature: a statement's signature does not verify against the signer's certificate.
	ErrBadSignature Error = "signature does not verify"
	// ErrBadStatement: a statement is incomplete (empty command ID, node ID or kind).
	ErrBadStatement Error = "bad statement"
	// ErrTenantCannotAttest: the signer holds a node-tenant (lessee) certificate; those never attest.
	ErrTenantCannotAttest Error = "node-tenant certificate cannot attest"
	// ErrNotNodeIdentity: the signer of a node statement is not a platform node identity.
	ErrNotNodeIdentity Error = "signer is not a node identity"
	// ErrNodeMismatch: the signer's node differs from the statement's node.
	ErrNodeMismatch Error = "signer's node differs from the statement's"
	// ErrGenerationMismatch: the statement's identity generation differs from the signer's certificate.
	ErrGenerationMismatch Error = "statement generation differs from the certificate's"
	// ErrIdentityRevoked: the signer's identity generation is not the node's current one
	// (metal.revokeIdentity bumped it).
	ErrIdentityRevoked Error = "identity generation revoked"
	// ErrNotSiteIdentity: the signer of a site statement is not a site agent.
	ErrNotSiteIdentity Error = "signer is not a site agent"
	// ErrSiteMismatch: the signing site agent belongs to another site.
	ErrSiteMismatch Error = "signer's site differs from the expected site"

	// ErrNotRecipient: a JWE cannot be addressed to that certificate (wrong kind or key).
	ErrNotRecipient Error = "certificate cannot receive encrypted secrets"
	// ErrDecrypt: a JWE does not parse or does not decrypt with the given key (tampered, wrong key).
	ErrDecrypt Error = "cannot decrypt"
)
