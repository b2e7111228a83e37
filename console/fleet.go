package console

import (
	"cmp"
	"slices"
	"time"

	"github.com/oncegate/oncegate/admin"
)

// breakerGroup is one destination's breakers across the fleet: each gateway keeps its own breaker per type,
// tenant and destination, so a fleet of ten reporting twenty destinations is two hundred rows. The home page
// shows one row per destination with how many gateways hold it open, which is what an operator asks.
type breakerGroup struct {
	Type, Tenant, Destination string
	// State is the worst state any live gateway reports: open, then half-open, then closed. A gone gateway's
	// breaker counts only when no live gateway reports the destination.
	State string
	// Open and HalfOpen count the gateways reporting that state; Gateways counts those reporting at all.
	Open, HalfOpen, Gateways int
	// OpenUntil is the latest time an open breaker lets a probe through.
	OpenUntil time.Time
	// OpenOn names the gateways holding it open.
	OpenOn []string
	// Gone is true when only gone gateways report it: their last word, not the fleet's present.
	Gone bool
}

func stateRank(s string) int {
	switch s {
	case "open":
		return 2
	case "half-open":
		return 1
	}
	return 0
}

func breakerGroups(gws []admin.Gateway) []breakerGroup {
	type key struct{ typ, tenant, dest string }
	byKey := map[key]*breakerGroup{}
	var order []key
	for _, g := range gws {
		for _, b := range g.Breakers {
			k := key{b.Type, b.Tenant, b.Destination}
			grp := byKey[k]
			if grp == nil {
				grp = &breakerGroup{Type: b.Type, Tenant: b.Tenant, Destination: b.Destination, State: "closed", Gone: true}
				byKey[k] = grp
				order = append(order, k)
			}
			if g.Alive && grp.Gone {
				// The first live report replaces what gone gateways said.
				*grp = breakerGroup{Type: b.Type, Tenant: b.Tenant, Destination: b.Destination, State: "closed"}
			} else if !g.Alive && !grp.Gone {
				continue
			}
			grp.Gateways++
			switch b.State {
			case "open":
				grp.Open++
				grp.OpenOn = append(grp.OpenOn, g.ID)
				if b.OpenUntil.After(grp.OpenUntil) {
					grp.OpenUntil = b.OpenUntil
				}
			case "half-open":
				grp.HalfOpen++
			}
			if stateRank(b.State) > stateRank(grp.State) {
				grp.State = b.State
			}
		}
	}
	out := make([]breakerGroup, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	slices.SortStableFunc(out, func(a, b breakerGroup) int {
		return cmp.Or(cmp.Compare(stateRank(b.State), stateRank(a.State)), cmp.Compare(a.Destination, b.Destination),
			cmp.Compare(a.Type, b.Type), cmp.Compare(a.Tenant, b.Tenant))
	})
	return out
}
