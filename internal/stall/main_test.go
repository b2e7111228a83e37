package stall

import (
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { leaktest.Main(m) }
