package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// FileFlag is the flag that names the config file; PrintFlag prints the
// effective configuration and exits.
const (
	FileFlag  = "config"
	PrintFlag = "print-config"
)

// notKeys are flags that are not settings: they have no key in the file.
var notKeys = map[string]bool{FileFlag: true, PrintFlag: true, "runtime": true, "help": true}

// Keys are the config file's keys, in the order of Config's fields: the
// names of serve's flags.
func Keys() []string {
	t := reflect.TypeFor[Config]()
	keys := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		keys = append(keys, t.Field(i).Tag.Get("yaml"))
	}
	return keys
}

// Path is the config file to read: the one --config names (which must
// exist; --config "" reads none), else DefaultPath when it exists, else ""
// (none).
func Path(fs *pflag.FlagSet) (string, error) {
	if f := fs.Lookup(FileFlag); f != nil && f.Changed {
		if f.Value.String() == "" {
			return "", nil
		}
		if _, err := os.Stat(f.Value.String()); err != nil {
			return "", fmt.Errorf("--config: %w", err)
		}
		return f.Value.String(), nil
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		return DefaultPath, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("config file %s: %w", DefaultPath, err)
	}
	return "", nil
}

// Load applies the YAML file at path to the flags of fs that the command
// line did not set: a flag given wins over the file, the file over the
// default. The file is strict: a key that is not one of serve's flags, a
// key given twice, a list for a flag that takes one value or a value the
// flag refuses is an error naming the file, the line and the key. A flag
// that is repeatable takes a list (or one value).
func Load(path string, fs *pflag.FlagSet) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	return apply(path, b, fs)
}

func apply(path string, b []byte, fs *pflag.FlagSet) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil // empty, or comments only
	}
	top := doc.Content[0]
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		return nil
	}
	if top.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: want a mapping of settings (key: value), got a %s", path, top.Line, kindName(top))
	}
	known := map[string]bool{}
	for _, k := range Keys() {
		known[k] = true
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		at := fmt.Sprintf("%s:%d", path, k.Line)
		key := k.Value
		f := fs.Lookup(key)
		if !known[key] || f == nil {
			return fmt.Errorf("%s: unknown key %q (the keys are serve's flags: %s)", at, key, strings.Join(Keys(), ", "))
		}
		if line, dup := seen[key]; dup {
			return fmt.Errorf("%s: key %q is given twice (first on line %d)", at, key, line)
		}
		seen[key] = k.Line
		values, err := scalars(v, f)
		if err != nil {
			return fmt.Errorf("%s: %s: %v", at, key, err)
		}
		if f.Changed {
			continue // the command line wins
		}
		for _, s := range values {
			if err := f.Value.Set(s); err != nil {
				return fmt.Errorf("%s: %s: %q is not a valid %s: %v", at, key, s, f.Value.Type(), err)
			}
		}
		if _, repeatable := f.Value.(pflag.SliceValue); repeatable && len(values) == 0 {
			f.Value.(pflag.SliceValue).Replace(nil)
		}
	}
	return nil
}

// scalars are the texts a node gives a flag: one for a scalar, each item
// of a list for a repeatable flag.
func scalars(v *yaml.Node, f *pflag.Flag) ([]string, error) {
	_, repeatable := f.Value.(pflag.SliceValue)
	switch {
	case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
		return nil, errors.New(`no value (write "" for an empty one)`)
	case v.Kind == yaml.ScalarNode:
		return []string{v.Value}, nil
	case v.Kind == yaml.SequenceNode && repeatable:
		var out []string
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				return nil, fmt.Errorf("line %d: want a value, got a %s", item.Line, kindName(item))
			}
			out = append(out, item.Value)
		}
		return out, nil
	case v.Kind == yaml.SequenceNode:
		return nil, fmt.Errorf("takes one %s, not a list", f.Value.Type())
	}
	return nil, fmt.Errorf("want a %s, got a %s", f.Value.Type(), kindName(v))
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	}
	return "value " + n.Value
}

// Print renders the settings of fs (its current values) as a config file
// that Load reads back to the same settings, each key under its flag's
// help. With commented, every key is commented out too: an example file
// that changes nothing.
func Print(fs *pflag.FlagSet, commented bool) ([]byte, error) {
	top := &yaml.Node{Kind: yaml.MappingNode}
	for _, key := range Keys() {
		f := fs.Lookup(key)
		if f == nil {
			return nil, fmt.Errorf("config key %q has no flag", key)
		}
		k := &yaml.Node{Kind: yaml.ScalarNode, Value: key, HeadComment: f.Usage}
		var v *yaml.Node
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
			for _, s := range sv.GetSlice() {
				v.Content = append(v.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s})
			}
		} else {
			tag := "!!str"
			switch f.Value.Type() {
			case "bool":
				tag = "!!bool"
			case "int", "int64":
				tag = "!!int"
			}
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: f.Value.String()}
		}
		top.Content = append(top.Content, k, v)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{top}}); err != nil {
		return nil, err
	}
	enc.Close()
	if !commented {
		return buf.Bytes(), nil
	}
	var out bytes.Buffer
	for line := range strings.Lines(buf.String()) {
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			out.WriteString(line)
			continue
		}
		out.WriteString("#" + line)
	}
	return out.Bytes(), nil
}
