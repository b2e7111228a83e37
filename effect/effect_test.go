package effect

import "testing"

// The client and the store branch on these predicates: a status added to Statuses without a decision here
// would be neither terminal nor valid by accident.
func TestStatusPredicates(t *testing.T) {
	t.Parallel()
	terminal := map[Status]bool{StatusDelivered: true, StatusFailed: true, StatusDead: true, StatusUnknown: true}
	for _, s := range Statuses() {
		if !s.Valid() {
			t.Errorf("%s is listed but not valid", s)
		}
		if s.Terminal() != terminal[s] {
			t.Errorf("%s: Terminal() = %v", s, s.Terminal())
		}
		if s.Retryable() != (terminal[s] && s != StatusDelivered) {
			t.Errorf("%s: Retryable() = %v", s, s.Retryable())
		}
	}
	for _, s := range RetryableStatuses() {
		if !s.Retryable() {
			t.Errorf("%s is listed as retryable but Retryable() is false", s)
		}
	}
	if Status("delivering ").Valid() || Status("").Valid() {
		t.Error("a status outside the list is valid")
	}
}
