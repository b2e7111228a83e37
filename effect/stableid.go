package effect

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// A stable id names one effect to the world outside: the webhook-id and Idempotency-Key a receiver sees, the
// Message-ID of an email, the effect_id of an analytics row. A receiver drops a message whose id it has seen,
// so the id must be the same on every attempt and rescue of an effect and new for every new effect, and an
// idempotency key names a new effect once retention has purged the old one. The id is therefore drawn when
// the effect is created and stored with it; it is derived from tenant and key as well, so that it tells
// nothing about the key it came from and never repeats across tenants.

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewStableID draws the stable id of a new effect of tenant under key: "eff_" and 26 base32 characters
// (130 bits) of SHA-256 over tenant, key and 16 random bytes of this creation.
func NewStableID(tenant, key string) string {
	return stableID(tenant + "\x00" + key + "\x00" + rand.Text())
}

// LegacyStableID is the id of an effect created before stable ids were stored (migration 00005): it was
// derived from tenant and key alone, and such an effect keeps it, so that a resend after the upgrade still
// carries the id its receiver may have seen.
func LegacyStableID(tenant, key string) string {
	return stableID(tenant + "\x00" + key)
}

func stableID(s string) string {
	h := sha256.Sum256([]byte(s))
	return "eff_" + strings.ToLower(idEncoding.EncodeToString(h[:])[:26])
}
