package effect

import (
	"regexp"
	"testing"
)

var idShape = regexp.MustCompile(`^eff_[a-z2-7]{26}$`)

// A key used again names a new effect, so each creation draws a new id; two tenants' ids never meet.
func TestNewStableIDIsNewForEachCreation(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		for _, tenant := range []string{"acme", "globex"} {
			id := NewStableID(tenant, "k1")
			if !idShape.MatchString(id) {
				t.Fatalf("id %q is not eff_ and 26 base32 characters", id)
			}
			if seen[id] {
				t.Fatalf("id %q drawn twice", id)
			}
			seen[id] = true
		}
	}
}

// Effects created before ids were stored keep the id their deliveries carried: the value is pinned, since a
// change would make every in-flight legacy effect's resend look new to its receiver.
func TestLegacyStableIDIsTheOldDerivation(t *testing.T) {
	if got := LegacyStableID("acme", "k1"); got != "eff_vg77qintyjl4mdnmg7frwbecso" {
		t.Fatalf("LegacyStableID(acme, k1) = %s", got)
	}
	if LegacyStableID("acme", "k1") == LegacyStableID("globex", "k1") {
		t.Fatal("legacy ids collide across tenants")
	}
}
