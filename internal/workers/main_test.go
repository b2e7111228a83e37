package workers

import (
	"testing"

	"github.com/oncegate/oncegate/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.Main(m) }
