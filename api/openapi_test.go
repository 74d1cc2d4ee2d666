package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// schemaTypes maps every component schema to the Go type it describes.
var schemaTypes = map[string]reflect.Type{
	"Limits":                reflect.TypeFor[Limits](),
	"CreateSandboxRequest":  reflect.TypeFor[CreateSandboxRequest](),
	"Sandbox":               reflect.TypeFor[Sandbox](),
	"ListSandboxesResponse": reflect.TypeFor[ListSandboxesResponse](),
	"ExecRequest":           reflect.TypeFor[ExecRequest](),
	"ExecResult":            reflect.TypeFor[ExecResult](),
	"ExecEvent":             reflect.TypeFor[ExecEvent](),
	"Process":               reflect.TypeFor[Process](),
	"ListProcessesResponse": reflect.TypeFor[ListProcessesResponse](),
	"SignalRequest":         reflect.TypeFor[SignalRequest](),
	"Error":                 reflect.TypeFor[Error](),
	"ErrorResponse":         reflect.TypeFor[ErrorResponse](),
	"VersionResponse":       reflect.TypeFor[VersionResponse](),
	"Timeouts":              reflect.TypeFor[Timeouts](),
	"UpdateSandboxRequest":  reflect.TypeFor[UpdateSandboxRequest](),
	"Usage":                 reflect.TypeFor[Usage](),
	"SandboxEvent":          reflect.TypeFor[SandboxEvent](),
}

type schema struct {
	Type            string             `yaml:"type"`
	Format          string             `yaml:"format"`
	ContentEncoding string             `yaml:"contentEncoding"`
	Ref             string             `yaml:"$ref"`
	Required        []string           `yaml:"required"`
	Properties      map[string]*schema `yaml:"properties"`
	Items           *schema            `yaml:"items"`
}

type document struct {
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas    map[string]*schema   `yaml:"schemas"`
		Responses  map[string]yaml.Node `yaml:"responses"`
		Parameters map[string]yaml.Node `yaml:"parameters"`
	} `yaml:"components"`
}

func loadDoc(t *testing.T) document {
	t.Helper()
	var d document
	if err := yaml.Unmarshal(openapiYAML, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestEveryTypeHasASchema parses types.go so that a new wire type cannot be
// added without its schema.
func TestEveryTypeHasASchema(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, spec := range gd.Specs {
			ts := spec.(*ast.TypeSpec)
			if _, isStruct := ts.Type.(*ast.StructType); isStruct && ts.Name.IsExported() {
				if _, ok := schemaTypes[ts.Name.Name]; !ok {
					t.Errorf("type %s has no entry in schemaTypes (and no schema checked)", ts.Name.Name)
				}
			}
		}
	}
	d := loadDoc(t)
	for name := range schemaTypes {
		if d.Components.Schemas[name] == nil {
			t.Errorf("no component schema %s", name)
		}
	}
}

type field struct {
	name     string
	typ      reflect.Type
	optional bool
}

func jsonFields(t reflect.Type) []field {
	var out []field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		optional := strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
		out = append(out, field{name: name, typ: f.Type, optional: optional})
	}
	return out
}

func checkType(t *testing.T, where string, goType reflect.Type, s *schema) {
	t.Helper()
	if s.Ref != "" {
		name := strings.TrimPrefix(s.Ref, "#/components/schemas/")
		want, ok := schemaTypes[name]
		if !ok || want != derefType(goType) {
			t.Errorf("%s: $ref %s does not describe %v", where, s.Ref, goType)
		}
		return
	}
	goType = derefType(goType)
	switch {
	case goType == reflect.TypeFor[time.Time]():
		if s.Type != "string" || s.Format != "date-time" {
			t.Errorf("%s: time.Time must be string/date-time, is %s/%s", where, s.Type, s.Format)
		}
	case goType.Kind() == reflect.Slice && goType.Elem().Kind() == reflect.Uint8:
		if s.Type != "string" || s.ContentEncoding != "base64" {
			t.Errorf("%s: []byte must be string/base64, is %s/%s", where, s.Type, s.ContentEncoding)
		}
	case goType.Kind() == reflect.Slice:
		if s.Type != "array" || s.Items == nil {
			t.Errorf("%s: slice must be an array with items", where)
			return
		}
		checkType(t, where+"[]", goType.Elem(), s.Items)
	case goType.Kind() == reflect.Map:
		if s.Type != "object" {
			t.Errorf("%s: map must be an object, is %s", where, s.Type)
		}
	case goType.Kind() == reflect.String:
		expect(t, where, s.Type, "string")
	case goType.Kind() == reflect.Bool:
		expect(t, where, s.Type, "boolean")
	case goType.Kind() >= reflect.Int && goType.Kind() <= reflect.Uint64:
		expect(t, where, s.Type, "integer")
	case goType.Kind() == reflect.Float64 || goType.Kind() == reflect.Float32:
		expect(t, where, s.Type, "number")
	case goType.Kind() == reflect.Struct:
		t.Errorf("%s: struct %v must be a $ref", where, goType)
	default:
		t.Errorf("%s: unhandled Go type %v", where, goType)
	}
}

func derefType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func expect(t *testing.T, where, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: schema type %q, Go type wants %q", where, got, want)
	}
}

// TestSchemasMatchGoTypes compares every schema with its Go type: the same
// JSON properties, the same types, and required exactly where the Go field
// is always sent.
func TestSchemasMatchGoTypes(t *testing.T) {
	d := loadDoc(t)
	for name, goType := range schemaTypes {
		s := d.Components.Schemas[name]
		if s == nil {
			continue
		}
		fields := jsonFields(goType)
		var goNames, docNames, goRequired []string
		for _, f := range fields {
			goNames = append(goNames, f.name)
			if !f.optional {
				goRequired = append(goRequired, f.name)
			}
			if p := s.Properties[f.name]; p != nil {
				checkType(t, name+"."+f.name, f.typ, p)
			}
		}
		for p := range s.Properties {
			docNames = append(docNames, p)
		}
		sort.Strings(goNames)
		sort.Strings(docNames)
		sort.Strings(goRequired)
		req := slices.Clone(s.Required)
		sort.Strings(req)
		if !slices.Equal(goNames, docNames) {
			t.Errorf("%s: Go fields %v, schema properties %v", name, goNames, docNames)
		}
		// Request bodies are all optional in Go (omitempty) but the doc may
		// still mark fields required; responses must match exactly.
		if !strings.HasSuffix(name, "Request") && !slices.Equal(goRequired, req) {
			t.Errorf("%s: always-sent fields %v, schema required %v", name, goRequired, req)
		}
	}
}

// TestOperations checks every operation: a unique operationId, a 2xx
// response, error responses that reference the error schema, and $refs that resolve.
func TestOperations(t *testing.T) {
	d := loadDoc(t)
	seen := map[string]bool{}
	for path, ops := range d.Paths {
		for method, node := range ops {
			if method == "parameters" {
				continue
			}
			var op struct {
				OperationID string `yaml:"operationId"`
				Responses   map[string]struct {
					Ref string `yaml:"$ref"`
				} `yaml:"responses"`
			}
			if err := node.Decode(&op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			if op.OperationID == "" || seen[op.OperationID] {
				t.Errorf("%s %s: missing or duplicate operationId %q", method, path, op.OperationID)
			}
			seen[op.OperationID] = true
			ok2xx := false
			for code, r := range op.Responses {
				if strings.HasPrefix(code, "2") {
					ok2xx = true
				} else {
					name := strings.TrimPrefix(r.Ref, "#/components/responses/")
					if _, exists := d.Components.Responses[name]; r.Ref == "" || !exists {
						t.Errorf("%s %s %s: error response must reference a components/responses entry", method, path, code)
					}
				}
			}
			if !ok2xx {
				t.Errorf("%s %s: no 2xx response", method, path)
			}
		}
	}
	// Every $ref in the document resolves.
	var root yaml.Node
	yaml.Unmarshal(openapiYAML, &root)
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		for i := 0; i+1 < len(n.Content); i++ {
			if n.Kind == yaml.MappingNode && n.Content[i].Value == "$ref" && i%2 == 0 {
				ref := n.Content[i+1].Value
				parts := strings.Split(strings.TrimPrefix(ref, "#/components/"), "/")
				ok := len(parts) == 2
				if ok {
					switch parts[0] {
					case "schemas":
						ok = d.Components.Schemas[parts[1]] != nil
					case "responses":
						_, ok = d.Components.Responses[parts[1]]
					case "parameters":
						_, ok = d.Components.Parameters[parts[1]]
					default:
						ok = false
					}
				}
				if !ok {
					t.Errorf("$ref %s does not resolve", ref)
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&root)
}

func TestRoutesListsEveryOperation(t *testing.T) {
	routes, err := Routes()
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 22 {
		t.Fatalf("%d operations, want 22: %v", len(routes), routes)
	}
}
