package gateway

// Reading the configuration file: ${VAR} expansion, the type knobs a provider block may spell, and the
// refusal of unknown keys, before the defaults are filled and the result checked.

import (
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads the configuration file at path ("" for none), expanding ${VAR} in values from the environment,
// refusing unknown fields with their path, filling defaults (WithDefaults) and checking the result. A file
// must name its tenants.
func Load(path string) (*Config, error) { return load(path, false) }

// LoadDev is Load for `gateway serve --dev`: Config.Dev is set, so a file without tenants (or no file) serves
// the built-in dev tenant, on a loopback address only.
func LoadDev(path string) (*Config, error) { return load(path, true) }

func load(path string, dev bool) (*Config, error) {
	c := Config{Dev: dev}
	var root *yaml.Node
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if root, err = parse(raw, &c); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	out := c.WithDefaults()
	if err := out.validate(); err != nil {
		if line := lineOf(root, err.Error()); line > 0 {
			return nil, fmt.Errorf("config %s: %w (line %d)", path, err, line)
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	return out, nil
}

func parse(raw []byte, c *Config) (*yaml.Node, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return nil, err
	}
	if len(root.Content) == 0 {
		return nil, nil // an empty file: all defaults
	}
	if err := expand(&root); err != nil {
		return nil, err
	}
	if err := hoistTypeKnobs(root.Content[0]); err != nil {
		return nil, err
	}
	if err := checkKnown(root.Content[0], reflect.TypeOf(Config{}), ""); err != nil {
		return nil, err
	}
	return root.Content[0], root.Content[0].Decode(c)
}

// fieldPath is the dotted path a check's error starts with (`limits.tenant_rate.requests_per_second: …`).
var fieldPath = regexp.MustCompile(`^[a-z_]+(\.[A-Za-z0-9_-]+)*`)

// lineOf finds the line of the deepest key of the file that the path at the start of a check's error names:
// the checks after parsing (a rate below its floor, two retentions at odds) read the decoded configuration,
// which has no lines, and an outside tester looked for their field in vain. 0: not found in the file (a
// default's fault, or no file).
func lineOf(root *yaml.Node, msg string) int {
	if root == nil {
		return 0
	}
	// `effect_types.x: retry.base_delay (1h0m0s) must be …` names effect_types.x.retry.base_delay: a check of a
	// part prefixes the part's path to its own (an outside test was given the line of x).
	var path []string
	for _, part := range strings.Split(msg, ": ") {
		p := fieldPath.FindString(part)
		if p == "" {
			break
		}
		path = append(path, strings.Split(p, ".")...)
		if p != part {
			break
		}
	}
	line, n := 0, root
	for _, seg := range path {
		if n.Kind != yaml.MappingNode {
			break
		}
		next := -1
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == seg {
				next = i
				break
			}
		}
		if next < 0 {
			break
		}
		line, n = n.Content[next].Line, n.Content[next+1]
	}
	return line
}

// envRef is ${VAR}, or ${VAR:-default}, whose default is used when VAR is unset or empty (as a shell does).
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// expand replaces ${VAR} in scalar values with the environment's VAR, and ${VAR:-default} with VAR or, when
// VAR is unset or empty, default. An unset VAR without a default is an error naming it and its line: read
// as empty, a missing secret became an empty credential, silently.
func expand(n *yaml.Node) error {
	var missing []string
	was := n.Value
	if n.Kind == yaml.ScalarNode {
		n.Value = envRef.ReplaceAllStringFunc(n.Value, func(ref string) string {
			m := envRef.FindStringSubmatch(ref)
			v, set := os.LookupEnv(m[1])
			switch {
			case m[2] != "" && v == "":
				return m[3]
			case !set:
				missing = append(missing, m[1])
			}
			return v
		})
	}
	if len(missing) > 0 {
		return fmt.Errorf("line %d: ${%s} is not set in the environment (write ${%s:-} where empty is meant)",
			n.Line, missing[0], missing[0])
	}
	if n.Kind == yaml.ScalarNode && n.Style == 0 && n.Value != was {
		// A plain scalar is what its value says once expanded: `per_second: ${RATE}` is a number, which the
		// parser, reading "${RATE}", had taken for a string (every number from the environment was refused).
		n.Tag = ""
	}
	for _, c := range n.Content {
		if err := expand(c); err != nil {
			return err
		}
	}
	return nil
}

// typeKnobs are settings of the effect type that SPEC §7 also lets a provider block spell (`smtp: {on_crash:
// …}`, `webhook: {timeout: …}`): one knob written in either place. hoistTypeKnobs moves them up to the type
// before decoding, so the rest of the gateway reads one field; a type that sets one in both places with
// different values is refused, rather than one silently winning.
var typeKnobs = []string{"on_crash", "timeout"}

func hoistTypeKnobs(root *yaml.Node) error {
	types := mapValue(root, "effect_types")
	if types == nil || types.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(types.Content); i += 2 {
		name, typ := types.Content[i].Value, types.Content[i+1]
		if typ.Kind != yaml.MappingNode {
			continue
		}
		for j := 0; j+1 < len(typ.Content); j += 2 {
			kind, block := typ.Content[j].Value, typ.Content[j+1]
			if _, ok := kindNamed(kind); !ok || block.Kind != yaml.MappingNode {
				continue
			}
			for _, knob := range typeKnobs {
				k, v := cutKey(block, knob)
				if v == nil {
					continue
				}
				if prev := mapValue(typ, knob); prev != nil {
					if prev.Value != v.Value {
						return fmt.Errorf("effect_types.%s: %s is set twice, %q on the type (line %d) and %q in its %s "+
							"block (line %d): it is one setting, set it once", name, knob, prev.Value, prev.Line,
							v.Value, kind, v.Line)
					}
					continue
				}
				typ.Content = append(typ.Content, k, v)
			}
		}
	}
	return nil
}

// mapValue returns the value under key in mapping node n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// cutKey removes key from mapping node n and returns its key and value nodes, or nils.
func cutKey(n *yaml.Node, key string) (k, v *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			k, v = n.Content[i], n.Content[i+1]
			n.Content = append(n.Content[:i:i], n.Content[i+2:]...)
			return k, v
		}
	}
	return nil, nil
}

// checkKnown walks a mapping node against the struct type it decodes into and returns the first key the
// struct does not have, with its dotted path, so a typo fails start-up instead of being ignored.
func checkKnown(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := map[string]reflect.StructField{}
		for i := 0; i < t.NumField(); i++ {
			if tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]; tag != "" && tag != "-" {
				fields[tag] = t.Field(i)
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			f, ok := fields[k]
			if !ok {
				known := make([]string, 0, len(fields))
				for f := range fields {
					known = append(known, f)
				}
				sort.Strings(known)
				return fmt.Errorf("%s: unknown field (line %d); known fields: %s", join(path, k),
					n.Content[i].Line, strings.Join(known, ", "))
			}
			if err := checkKnown(n.Content[i+1], f.Type, join(path, k)); err != nil {
				return err
			}
			if err := checkPositive(n.Content[i+1], f, join(path, k)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkKnown(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, c := range n.Content {
			if err := checkKnown(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.ScalarNode && reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()):
		// A value of the file's own types ("10s", "8MiB", "unlimited"): its error names a line, and here the
		// field too (an outside test met `line 10: "0" is not a positive rate` with no field to look for).
		if err := reflect.New(t).Interface().(yaml.Unmarshaler).UnmarshalYAML(n); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	case n.Kind == yaml.ScalarNode && (isInt(t.Kind()) || isFloat(t.Kind())) &&
		!reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()):
		// A plain number field: the decoder's own error for `per_second: unlimited` or `burst: 1e20` names a
		// line and a Go type, not the field (an outside test).
		tag := n.ShortTag()
		if tag != "!!int" && tag != "!!float" {
			return fmt.Errorf("%s: %q (line %d): want a number", path, n.Value, n.Line)
		}
		if !isInt(t.Kind()) {
			break
		}
		// The YAML decoder cuts 1.5 down to 1 for a whole-number field, silently (an outside test's
		// `burst: 1.5` started a gateway with a burst of 1).
		if f, err := strconv.ParseFloat(n.Value, 64); err != nil || f != math.Trunc(f) {
			return fmt.Errorf("%s: %q (line %d): want a whole number", path, n.Value, n.Line)
		} else if math.Abs(f) >= 1<<62 {
			return fmt.Errorf("%s: %q (line %d): too large", path, n.Value, n.Line)
		}
	}
	return nil
}

// checkPositive refuses an explicit zero in a field tagged `oncegate:"positive"`, whose zero value the
// defaults read as left out: `request_burst: 0` became the default burst of 1,000, silently, and with
// `scope: fleet` one gateway's take loosened the whole fleet's bucket (an outside test).
func checkPositive(n *yaml.Node, f reflect.StructField, path string) error {
	if f.Tag.Get("oncegate") != "positive" || n.Kind != yaml.ScalarNode {
		return nil
	}
	v := reflect.New(f.Type)
	if err := n.Decode(v.Interface()); err != nil {
		return nil // checkKnown, or the decoder, says what is wrong with it
	}
	if isInt(v.Elem().Kind()) && v.Elem().Int() <= 0 {
		return fmt.Errorf("%s: %q (line %d): want at least 1 (leave it out for the default)", path, n.Value, n.Line)
	}
	return nil
}

func isInt(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func isFloat(k reflect.Kind) bool { return k == reflect.Float32 || k == reflect.Float64 }

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}
