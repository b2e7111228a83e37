package gateway

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every provider kind is one entry of providerKinds, and the entry matches the rest of the gateway: its block
// is EffectType's field named after it (and no other kind's), every block field of EffectType has an entry,
// and docs/configuration.md names the kind where it lists them and gives its block's keys.
func TestEveryProviderKindIsOneEntry(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	row := func(prefix string) string { // the doc's table row that starts with prefix
		for _, l := range strings.Split(string(doc), "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("docs/configuration.md: no row starting %q", prefix)
		return ""
	}
	providerRow, blocksRow := row("| `provider` |"), row("| `postgres`, ")

	et := reflect.TypeOf(EffectType{})
	blockFields := map[string]int{} // yaml key → field index, for the fields that are a kind's block
	for i := 0; i < et.NumField(); i++ {
		f := et.Field(i)
		if f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Struct && f.Type.Elem().PkgPath() != et.PkgPath() {
			blockFields[strings.Split(f.Tag.Get("yaml"), ",")[0]] = i
		}
	}
	var names []string
	for _, k := range providerKinds {
		names = append(names, k.name)
		i, ok := blockFields[k.name]
		if !ok {
			t.Errorf("kind %s: EffectType has no block field %q", k.name, k.name)
			continue
		}
		var typ EffectType
		reflect.ValueOf(&typ).Elem().Field(i).Set(reflect.New(et.Field(i).Type.Elem()))
		for _, other := range providerKinds {
			if got := other.block.set(&typ); got != (other.name == k.name) {
				t.Errorf("EffectType.%s set: kind %s sees its block set = %v", et.Field(i).Name, other.name, got)
			}
		}
		if !strings.Contains(providerRow, "`"+k.name+"`") || !strings.Contains(blocksRow, "`"+k.name+"`") {
			t.Errorf("docs/configuration.md: the effect type table does not name the kind %s", k.name)
		}
		if !regexp.MustCompile(`\n\| ([a-z]+, )*` + k.name + `(, [a-z]+)* \| ` + "`").Match(doc) {
			t.Errorf("docs/configuration.md: Provider blocks has no row for %s", k.name)
		}
	}
	for key := range blockFields {
		if !slices.Contains(names, key) {
			t.Errorf("EffectType's block %q is no kind of providerKinds", key)
		}
	}
	if kinds != strings.Join(names, ", ") {
		t.Errorf("kinds %q, want every kind: %v", kinds, names)
	}
}

// A block of another kind is refused, naming it, for every pair of kinds; a kind without its block is
// refused unless its block is optional.
func TestEveryKindRefusesAnotherKindsBlock(t *testing.T) {
	for _, k := range providerKinds {
		for _, other := range providerKinds {
			if other.name == k.name {
				continue
			}
			_, err := Load(writeConfig(t, tenantsYAML+"effect_types: { x: { provider: "+k.name+", "+other.name+": {} } }"))
			want := "effect_types.x: " + other.name + ": a " + other.name + ` block on an effect type whose provider is "` + k.name + `"`
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("a %s type with a %s block: %v, want %q", k.name, other.name, err, want)
			}
		}
		_, err := Load(writeConfig(t, tenantsYAML+"effect_types: { x: { provider: "+k.name+" } }"))
		switch want := "effect_types.x: " + k.name + ": the settings of the " + k.name + " provider are missing"; {
		case k.optional && err != nil:
			t.Errorf("a %s type without its optional block: %v", k.name, err)
		case !k.optional && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("a %s type without its block: %v, want %q", k.name, err, want)
		}
	}
}
