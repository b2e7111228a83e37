package gateway

// The file's value types: durations, sizes and rates as people write them ("10s", "256KiB", "unlimited"),
// each parsed by its UnmarshalYAML so that a bad value names its line.

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Unlimited, as a PerSecond or a ByteRate ("unlimited" in the file), turns a bucket off.
const Unlimited = -1

// PerSecond is a rate written as a number ("50", "0.5") or "unlimited".
type PerSecond float64

func (p *PerSecond) UnmarshalYAML(n *yaml.Node) error {
	if n.Value == "unlimited" {
		*p = Unlimited
		return nil
	}
	v, err := strconv.ParseFloat(n.Value, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Errorf("line %d: %q is not a positive rate like 50 or \"unlimited\"", n.Line, n.Value)
	}
	*p = PerSecond(v)
	return nil
}

// ByteRate is bytes per second written as a size ("8MiB") or "unlimited".
type ByteRate int64

func (b *ByteRate) UnmarshalYAML(n *yaml.Node) error {
	if n.Value == "unlimited" {
		*b = Unlimited
		return nil
	}
	var s ByteSize
	if err := s.UnmarshalYAML(n); err != nil || s == 0 {
		return fmt.Errorf("line %d: %q is not a positive size like 8MiB or \"unlimited\"", n.Line, n.Value)
	}
	*b = ByteRate(s)
	return nil
}

// Duration is a time.Duration written as "1s", "10m", "24h".
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a duration like 10s or 24h", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// ByteSize is a size written as "256KiB", "1MiB", "1000" (bytes).
type ByteSize int64

var sizeRe = regexp.MustCompile(`^(\d+)\s*(B|KB|KiB|MB|MiB)?$`)

func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	m := sizeRe.FindStringSubmatch(strings.TrimSpace(n.Value))
	if m == nil {
		return fmt.Errorf("line %d: %q is not a size like 256KiB", n.Line, n.Value)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	mult := map[string]int64{"": 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 1000_000, "MiB": 1 << 20}[m[2]]
	*b = ByteSize(v * mult)
	return nil
}
