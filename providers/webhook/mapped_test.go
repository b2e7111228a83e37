package webhook

import (
	"context"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/providers"
)

// An IP entry matches any spelling of its address, the IPv4-mapped IPv6 ones included: ::ffff:127.0.0.1 is
// 127.0.0.1 (the dialer connects to it as such), whichever side spells it so. Against a real receiver.
func TestAllowedIPEntriesMatchIPv4MappedSpellings(t *testing.T) {
	t.Parallel()
	r := newReceiver(t)
	port := r.srv.URL[strings.LastIndex(r.srv.URL, ":")+1:]
	for _, entry := range []string{"http://127.0.0.1:" + port, "http://[::ffff:127.0.0.1]:" + port, "http://[::ffff:7f00:1]:" + port} {
		p, err := New(Config{Secret: secretA, AllowPrivateNetworks: true, AllowedHosts: []string{entry}})
		if err != nil {
			t.Fatalf("entry %s: %v", entry, err)
		}
		for _, host := range []string{"127.0.0.1", "[::ffff:127.0.0.1]", "[::FFFF:7F00:1]", "[0:0:0:0:0:ffff:127.0.0.1]"} {
			u := "http://" + host + ":" + port + "/hook"
			if err := p.Validate(urlPayload(u)); err != nil {
				t.Errorf("entry %s: %s refused: %v", entry, u, err)
				continue
			}
			if o := p.Deliver(context.Background(), delivery("mapped-"+entry+host, string(urlPayload(u)))); o.Kind != providers.KindDelivered {
				t.Errorf("entry %s: %s: %v %v", entry, u, o.Kind, o.Err)
			}
		}
		// Another address, mapped or not, is still another address.
		for _, host := range []string{"[::ffff:127.0.0.2]", "127.0.0.2", "[::1]", "[::127.0.0.1]"} {
			if err := p.Validate(urlPayload("http://" + host + ":" + port + "/hook")); err == nil {
				t.Errorf("entry %s: %s allowed", entry, host)
			}
		}
	}
}
