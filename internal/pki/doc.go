// Package pki is bcd's identity and attestation crypto: the control plane's CA, the identities
// it certifies, mTLS configurations, signed ("attested") command results, secrets encrypted to
// an agent (JWE) and bearer tokens. It holds no state: callers persist the PEM/DER bytes it
// returns. A *CA is read-only after it is made and safe for concurrent use.
//
// # Keys
//
// Every key is ECDSA P-256. One algorithm for the CA, servers and agents keeps verification to a
// single code path; P-256 is what every TLS stack, TPM and HSM supports; and, unlike Ed25519, an
// agent's one P-256 key both signs (TLS, attested results) and receives secrets by ECDH-ES
// (JWE), so an agent never needs a second key.
//
// # Identities
//
// A certificate carries exactly one URI SAN with the bcd scheme (ParseIdentity):
//
//	bcd://site-agent/<site ID>/<agent ID>          client auth, may receive secrets
//	bcd://node/<node ID>/<generation>              client auth, may receive secrets, attests
//	bcd://node-tenant/<node ID>/<generation>/<tenant ID>   client auth only; never attests
//	bcd://server                                   server auth (DNS/IP SANs for the hosts)
//
// IDs are 1–128 characters of [A-Za-z0-9._-] starting with a letter or digit; the generation is
// a canonical decimal uint64. Only the canonical spelling parses. The CA takes nothing but the
// key from a CSR: subject and extensions requested by the agent are ignored.
//
// # Attested results
//
// A node signs Statement{CommandID, NodeID, Kind, Generation, ResultSHA256} with its key:
// ECDSA (ASN.1 DER) over SHA-256(SigningInput(st)), where SigningInput is a domain string and
// each field, variable-length ones prefixed by their length as a big-endian uint64 (see
// SigningInput). ResultSHA256 is ResultDigest of the result JSON exactly as stored. The
// control plane rebuilds the statement from the command row and calls VerifyStatement with the
// node's current identity generation; a site agent signs bmc.rotate results the same way, checked
// with VerifySiteStatement. Refusals wrap one sentinel (ErrTenantCannotAttest, ErrIdentityRevoked…)
// for the caller to record.
//
// # Secrets to an agent
//
// EncryptToAgent makes a compact JWE (ECDH-ES+A256KW, A256GCM, kid = SHA-256 of the recipient
// certificate) to a site-agent or node certificate; DecryptAsAgent opens it with the agent's key
// and accepts no other algorithm.
//
// # Tokens
//
// NewToken returns prefix + 52 lower-case base32 characters (256 random bits) and the
// SHA-256 of the whole string, which is all that is stored; TokenMatches compares in constant time.
package pki
