package dedup

import (
	"os"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/leaktest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
)

func TestMain(m *testing.M) {
	if proctest.Role() == "handoff" {
		os.Exit(handoffProcess())
	}
	leaktest.Main(m)
}
