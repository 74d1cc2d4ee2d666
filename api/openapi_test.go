package api

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/berthsh/berth/errdefs"
)

// schemaTypes maps each component schema of openapi.yaml to the Go type it
// describes. Every exported struct type of types.go must have an entry, and
// every component schema must be one (TestSchemaTableCoversTypes).
var schemaTypes = map[string]reflect.Type{
	"Timeouts":              reflect.TypeFor[Timeouts](),
	"Limits":                reflect.TypeFor[Limits](),
	"CreateSandboxRequest":  reflect.TypeFor[CreateSandboxRequest](),
	"Sandbox":               reflect.TypeFor[Sandbox](),
	"UpdateSandboxRequest":  reflect.TypeFor[UpdateSandboxRequest](),
	"Usage":                 reflect.TypeFor[Usage](),
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
	"SandboxEvent":          reflect.TypeFor[SandboxEvent](),
	"Runtime":               reflect.TypeFor[Runtime](),
	"RuntimeCapabilities":   reflect.TypeFor[RuntimeCapabilities](),
	"ListRuntimesResponse":  reflect.TypeFor[ListRuntimesResponse](),
	// The network's types (network.go).
	"Network":             reflect.TypeFor[Network](),
	"SecretBinding":       reflect.TypeFor[SecretBinding](),
	"CreateSecretRequest": reflect.TypeFor[CreateSecretRequest](),
	"UpdateSecretRequest": reflect.TypeFor[UpdateSecretRequest](),
	"Secret":              reflect.TypeFor[Secret](),
	"ListSecretsResponse": reflect.TypeFor[ListSecretsResponse](),
	"APIKey":              reflect.TypeFor[APIKey](),
	"CreateAPIKeyRequest": reflect.TypeFor[CreateAPIKeyRequest](),
	"ListAPIKeysResponse": reflect.TypeFor[ListAPIKeysResponse](),
	"AuditRecord":         reflect.TypeFor[AuditRecord](),
	"ListAuditResponse":   reflect.TypeFor[ListAuditResponse](),
	"Quota":               reflect.TypeFor[Quota](),
	"TenantUsage":         reflect.TypeFor[TenantUsage](),
	"UsageResponse":       reflect.TypeFor[UsageResponse](),
	"EgressRecord":        reflect.TypeFor[EgressRecord](),
	"ListEgressResponse":  reflect.TypeFor[ListEgressResponse](),
	"EgressSummary":       reflect.TypeFor[EgressSummary](),
	// The images' types (images.go).
	"Image":              reflect.TypeFor[Image](),
	"ImageConfig":        reflect.TypeFor[ImageConfig](),
	"PullImageRequest":   reflect.TypeFor[PullImageRequest](),
	"PruneImagesRequest": reflect.TypeFor[PruneImagesRequest](),
	"PruneResult":        reflect.TypeFor[PruneResult](),
	"PullEvent":          reflect.TypeFor[PullEvent](),
	"BuildEvent":         reflect.TypeFor[BuildEvent](),
	"BuildResult":        reflect.TypeFor[BuildResult](),
	"Pool":               reflect.TypeFor[Pool](),
	"ListImagesResponse": reflect.TypeFor[ListImagesResponse](),
	"ListPoolsResponse":  reflect.TypeFor[ListPoolsResponse](),
	// The ports' types (ports.go).
	"Port":                reflect.TypeFor[Port](),
	"ListPortsResponse":   reflect.TypeFor[ListPortsResponse](),
	"AccessTokenResponse": reflect.TypeFor[AccessTokenResponse](),
	// The terminals' types (terminals.go).
	"TTY":             reflect.TypeFor[TTY](),
	"TerminalMessage": reflect.TypeFor[TerminalMessage](),
	// The file API's types (files.go).
	"FileInfo":        reflect.TypeFor[FileInfo](),
	"StatRequest":     reflect.TypeFor[StatRequest](),
	"ExistsResult":    reflect.TypeFor[ExistsResult](),
	"ListRequest":     reflect.TypeFor[ListRequest](),
	"ListResult":      reflect.TypeFor[ListResult](),
	"MkdirRequest":    reflect.TypeFor[MkdirRequest](),
	"MoveRequest":     reflect.TypeFor[MoveRequest](),
	"RemoveRequest":   reflect.TypeFor[RemoveRequest](),
	"ChmodRequest":    reflect.TypeFor[ChmodRequest](),
	"ChownRequest":    reflect.TypeFor[ChownRequest](),
	"ReadRequest":     reflect.TypeFor[ReadRequest](),
	"Line":            reflect.TypeFor[Line](),
	"ReadResult":      reflect.TypeFor[ReadResult](),
	"WriteRequest":    reflect.TypeFor[WriteRequest](),
	"EditRequest":     reflect.TypeFor[EditRequest](),
	"EditResult":      reflect.TypeFor[EditResult](),
	"GlobRequest":     reflect.TypeFor[GlobRequest](),
	"GlobResult":      reflect.TypeFor[GlobResult](),
	"GrepRequest":     reflect.TypeFor[GrepRequest](),
	"GrepMatch":       reflect.TypeFor[GrepMatch](),
	"GrepResult":      reflect.TypeFor[GrepResult](),
	"UploadFile":      reflect.TypeFor[UploadFile](),
	"UploadRequest":   reflect.TypeFor[UploadRequest](),
	"FileError":       reflect.TypeFor[FileError](),
	"FileResult":      reflect.TypeFor[FileResult](),
	"UploadResult":    reflect.TypeFor[UploadResult](),
	"DownloadRequest": reflect.TypeFor[DownloadRequest](),
	"DownloadResult":  reflect.TypeFor[DownloadResult](),
	"ArchiveResult":   reflect.TypeFor[ArchiveResult](),
	"WatchEvent":      reflect.TypeFor[WatchEvent](),
	// The snapshots' types (snapshots.go).
	"CreateSnapshotRequest": reflect.TypeFor[CreateSnapshotRequest](),
	"Snapshot":              reflect.TypeFor[Snapshot](),
	"ListSnapshotsResponse": reflect.TypeFor[ListSnapshotsResponse](),
	"ForkRequest":           reflect.TypeFor[ForkRequest](),
	"ForkResponse":          reflect.TypeFor[ForkResponse](),
	"Change":                reflect.TypeFor[Change](),
	"DiffResponse":          reflect.TypeFor[DiffResponse](),
	"ApplyRequest":          reflect.TypeFor[ApplyRequest](),
	"PauseRequest":          reflect.TypeFor[PauseRequest](),
	"ApplyResult":           reflect.TypeFor[ApplyResult](),
}

// wantRoutes is every operation the API has, in Routes' order.
var wantRoutes = []Route{
	{"GET", "/healthz"},
	{"GET", "/metrics"},
	{"GET", "/v1/audit"},
	{"GET", "/v1/images"},
	{"POST", "/v1/images/import"},
	{"POST", "/v1/images/prune"},
	{"POST", "/v1/images/pull"},
	{"DELETE", "/v1/images/{ref}"},
	{"GET", "/v1/images/{ref}"},
	{"GET", "/v1/keys"},
	{"POST", "/v1/keys"},
	{"DELETE", "/v1/keys/{key}"},
	{"GET", "/v1/keys/{key}"},
	{"GET", "/v1/pools"},
	{"PUT", "/v1/pools"},
	{"GET", "/v1/runtimes"},
	{"GET", "/v1/sandboxes"},
	{"POST", "/v1/sandboxes"},
	{"POST", "/v1/sandboxes/get-or-create"},
	{"DELETE", "/v1/sandboxes/{id}"},
	{"GET", "/v1/sandboxes/{id}"},
	{"PATCH", "/v1/sandboxes/{id}"},
	{"POST", "/v1/sandboxes/{id}/access-token"},
	{"POST", "/v1/sandboxes/{id}/apply"},
	{"GET", "/v1/sandboxes/{id}/archive"},
	{"PUT", "/v1/sandboxes/{id}/archive"},
	{"GET", "/v1/sandboxes/{id}/diff"},
	{"GET", "/v1/sandboxes/{id}/egress"},
	{"GET", "/v1/sandboxes/{id}/events"},
	{"POST", "/v1/sandboxes/{id}/exec"},
	{"GET", "/v1/sandboxes/{id}/files"},
	{"PUT", "/v1/sandboxes/{id}/files"},
	{"POST", "/v1/sandboxes/{id}/fork"},
	{"POST", "/v1/sandboxes/{id}/fs/chmod"},
	{"POST", "/v1/sandboxes/{id}/fs/chown"},
	{"POST", "/v1/sandboxes/{id}/fs/download"},
	{"POST", "/v1/sandboxes/{id}/fs/edit"},
	{"POST", "/v1/sandboxes/{id}/fs/exists"},
	{"POST", "/v1/sandboxes/{id}/fs/glob"},
	{"POST", "/v1/sandboxes/{id}/fs/grep"},
	{"POST", "/v1/sandboxes/{id}/fs/list"},
	{"POST", "/v1/sandboxes/{id}/fs/mkdir"},
	{"POST", "/v1/sandboxes/{id}/fs/move"},
	{"POST", "/v1/sandboxes/{id}/fs/read"},
	{"POST", "/v1/sandboxes/{id}/fs/remove"},
	{"POST", "/v1/sandboxes/{id}/fs/stat"},
	{"POST", "/v1/sandboxes/{id}/fs/upload"},
	{"GET", "/v1/sandboxes/{id}/fs/watch"},
	{"POST", "/v1/sandboxes/{id}/fs/write"},
	{"POST", "/v1/sandboxes/{id}/keepalive"},
	{"POST", "/v1/sandboxes/{id}/pause"},
	{"GET", "/v1/sandboxes/{id}/ports"},
	{"GET", "/v1/sandboxes/{id}/ports/{port}/{path}"},
	{"GET", "/v1/sandboxes/{id}/processes"},
	{"POST", "/v1/sandboxes/{id}/processes"},
	{"DELETE", "/v1/sandboxes/{id}/processes/{pid}"},
	{"GET", "/v1/sandboxes/{id}/processes/{pid}"},
	{"GET", "/v1/sandboxes/{id}/processes/{pid}/attach"},
	{"GET", "/v1/sandboxes/{id}/processes/{pid}/output"},
	{"POST", "/v1/sandboxes/{id}/processes/{pid}/signal"},
	{"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin"},
	{"POST", "/v1/sandboxes/{id}/processes/{pid}/wait"},
	{"GET", "/v1/sandboxes/{id}/pty"},
	{"POST", "/v1/sandboxes/{id}/resume"},
	{"POST", "/v1/sandboxes/{id}/snapshots"},
	{"POST", "/v1/sandboxes/{id}/start"},
	{"GET", "/v1/sandboxes/{id}/stats"},
	{"POST", "/v1/sandboxes/{id}/stop"},
	{"GET", "/v1/sandboxes/{id}/tunnel/{port}"},
	{"GET", "/v1/secrets"},
	{"POST", "/v1/secrets"},
	{"DELETE", "/v1/secrets/{name}"},
	{"GET", "/v1/secrets/{name}"},
	{"PUT", "/v1/secrets/{name}"},
	{"GET", "/v1/snapshots"},
	{"DELETE", "/v1/snapshots/{name}"},
	{"GET", "/v1/snapshots/{name}"},
	{"GET", "/v1/templates"},
	{"POST", "/v1/templates/build"},
	{"PUT", "/v1/tenants/{tenant}/quota"},
	{"GET", "/v1/usage"},
	{"GET", "/v1/version"},
}

// enumConsts ties an enum of the document to the const blocks of typeFiles
// that hold the members named: the enum is their union.
var enumConsts = []struct {
	schema, property string
	members          []string
}{
	{"Sandbox", "state", []string{"StateCreating", "StatePaused"}},
	{"ExecEvent", "type", []string{"EventStart"}},
	{"SandboxEvent", "type", []string{"SandboxCreated", "SandboxPaused"}},
	{"FileInfo", "type", []string{"TypeFile"}},
	{"WatchEvent", "type", []string{"WatchCreate"}},
	{"Network", "mode", []string{"NetworkNone"}},
	{"EgressRecord", "proto", []string{"EgressDNS"}},
	{"PullEvent", "status", []string{"PullResolved"}},
	{"BuildEvent", "type", []string{"BuildStep"}},
	{"Change", "kind", []string{"ChangeAdded"}},
}

// typeFiles are the files that declare the API's wire types.
var typeFiles = []string{"types.go", "files.go", "network.go", "ports.go", "terminals.go", "images.go", "templates.go", "snapshots.go", "keys.go", "tenants.go"}

// declaredStructs returns the exported struct types of typeFiles.
func declaredStructs(t *testing.T) map[string]*ast.TypeSpec {
	out := map[string]*ast.TypeSpec{}
	for _, f := range typeFiles {
		for k, v := range structDecls(parseGo(t, f)) {
			out[k] = v
		}
	}
	return out
}

// declaredConsts returns the const blocks of typeFiles.
func declaredConsts(t *testing.T) []map[string]string {
	var out []map[string]string
	for _, f := range typeFiles {
		out = append(out, constBlocks(t, parseGo(t, f), "")...)
	}
	return out
}

const schemaPrefix = "#/components/schemas/"

// loadDoc parses openapi.yaml into plain maps and lists.
func loadDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	return doc
}

// obj returns v as a map, or nil.
func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// strs returns v, a YAML list of strings, as a slice.
func strs(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, e := range list {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

// at walks keys down from v.
func at(v any, keys ...string) any {
	for _, k := range keys {
		v = obj(v)[k]
	}
	return v
}

// resolve follows a local JSON pointer ("#/a/b") in doc.
func resolve(doc map[string]any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("$ref %q is not local", ref)
	}
	var v any = doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := v.(type) {
		case map[string]any:
			next, ok := c[tok]
			if !ok {
				return nil, fmt.Errorf("$ref %q: no %q", ref, tok)
			}
			v = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("$ref %q: no element %q", ref, tok)
			}
			v = c[i]
		default:
			return nil, fmt.Errorf("$ref %q: %q is inside a scalar", ref, tok)
		}
	}
	return v, nil
}

// deref follows v's $ref, if it has one, to the object it names.
func deref(t *testing.T, doc map[string]any, v any) map[string]any {
	t.Helper()
	for range 8 {
		ref, ok := obj(v)["$ref"].(string)
		if !ok {
			return obj(v)
		}
		next, err := resolve(doc, ref)
		if err != nil {
			t.Error(err)
			return nil
		}
		v = next
	}
	t.Errorf("$ref chain too long at %v", v)
	return nil
}

// parseGo parses a Go file of the tree with its comments.
func parseGo(t *testing.T, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// structDecls returns the exported struct types of a file by name.
func structDecls(f *ast.File) map[string]*ast.TypeSpec {
	out := map[string]*ast.TypeSpec{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, s := range gd.Specs {
			ts := s.(*ast.TypeSpec)
			if _, ok := ts.Type.(*ast.StructType); ok && ts.Name.IsExported() {
				if ts.Doc == nil && len(gd.Specs) == 1 {
					ts.Doc = gd.Doc
				}
				out[ts.Name.Name] = ts
			}
		}
	}
	return out
}

// constBlocks returns the string constants of each const block of a file,
// by name; typ, if set, keeps only constants declared with that type name.
func constBlocks(t *testing.T, f *ast.File, typ string) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		block := map[string]string{}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			if typ != "" {
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typ {
					continue
				}
			}
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				block[name.Name] = v
			}
		}
		if len(block) > 0 {
			out = append(out, block)
		}
	}
	return out
}

// jsonField is one member of a struct's JSON object.
type jsonField struct {
	name     string
	goName   string
	typ      reflect.Type
	optional bool // omitted when empty or zero
	quoted   bool // the ",string" option
	depth    int  // embedding depth
}

// jsonFields lists a struct's JSON members the way encoding/json does:
// "-" skipped, unexported fields skipped, untagged embedded structs promoted,
// and a name at two depths kept only at the shallower (dropped when tied).
func jsonFields(t reflect.Type) []jsonField {
	var all []jsonField
	var walk func(t reflect.Type, depth int)
	walk = func(t reflect.Type, depth int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			ft := f.Type
			if f.Anonymous && name == "" {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					walk(et, depth+1)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			optList := strings.Split(opts, ",")
			omitEmpty := slices.Contains(optList, "omitempty") && ft.Kind() != reflect.Struct // omitempty never omits a struct
			all = append(all, jsonField{
				name:     name,
				goName:   f.Name,
				typ:      ft,
				optional: omitEmpty || slices.Contains(optList, "omitzero"),
				quoted:   slices.Contains(optList, "string"),
				depth:    depth,
			})
		}
	}
	walk(t, 0)
	var out []jsonField
	for _, f := range all {
		keep := true
		for _, g := range all {
			if g.name == f.name && (g.depth < f.depth || (g.depth == f.depth && g.goName != f.goName)) {
				keep = false
			}
		}
		if keep {
			out = append(out, f)
		}
	}
	return out
}

// schemaNameOf returns the component schema of a Go struct type.
func schemaNameOf(t reflect.Type) (string, bool) {
	for name, st := range schemaTypes {
		if st == t {
			return name, true
		}
	}
	return "", false
}

// typeList returns a schema's "type", a string or a list, as a list.
func typeList(v any) []string {
	if s, ok := v.(string); ok {
		return []string{s}
	}
	return strs(v)
}

var timeType = reflect.TypeFor[time.Time]()

// checkType checks that schema s describes values of Go type gt.
func checkType(t *testing.T, where string, s map[string]any, gt reflect.Type, quoted bool) {
	t.Helper()
	if s == nil {
		t.Errorf("%s: no schema", where)
		return
	}
	nillable := false
	switch gt.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
		nillable = true
	}
	if gt.Kind() == reflect.Pointer {
		gt = gt.Elem()
	}
	if ref, ok := s["$ref"].(string); ok {
		name, known := schemaNameOf(gt)
		if gt.Kind() != reflect.Struct || gt == timeType || !known {
			t.Errorf("%s: $ref %s, but Go type %s has no component schema", where, ref, gt)
		} else if ref != schemaPrefix+name {
			t.Errorf("%s: $ref %s, want %s%s", where, ref, schemaPrefix, name)
		}
		return
	}
	types := typeList(s["type"])
	if i := slices.Index(types, "null"); i >= 0 {
		if !nillable {
			t.Errorf("%s: type allows null, but Go type %s cannot be nil", where, gt)
		}
		types = slices.Delete(types, i, i+1)
	}
	if len(types) != 1 {
		t.Errorf("%s: type %v, want exactly one JSON type (and maybe null)", where, s["type"])
		return
	}
	got := types[0]
	isBytes := gt.Kind() == reflect.Slice && gt.Elem().Kind() == reflect.Uint8
	if enc, _ := s["contentEncoding"].(string); (enc == "base64") != isBytes {
		t.Errorf("%s: contentEncoding %q for Go type %s (base64 exactly for []byte)", where, enc, gt)
	}
	if format, _ := s["format"].(string); (format == "date-time") != (gt == timeType) {
		t.Errorf("%s: format %q for Go type %s (date-time exactly for time.Time)", where, format, gt)
	}
	var want string
	switch k := gt.Kind(); {
	case gt == timeType, isBytes, k == reflect.String:
		want = "string"
	case k == reflect.Bool:
		want = "boolean"
	case k >= reflect.Int && k <= reflect.Uint64:
		want = "integer"
	case k == reflect.Float32 || k == reflect.Float64:
		want = "number"
	case k == reflect.Slice || k == reflect.Array:
		want = "array"
	case k == reflect.Map:
		want = "object"
	case k == reflect.Struct:
		t.Errorf("%s: Go struct %s must be a $ref to its component schema", where, gt)
		return
	default:
		t.Errorf("%s: Go type %s has no JSON mapping this test knows", where, gt)
		return
	}
	if quoted && (want == "integer" || want == "number" || want == "boolean") {
		want = "string"
	}
	if got != want {
		t.Errorf("%s: type %q, want %q for Go type %s", where, got, want, gt)
		return
	}
	switch want {
	case "array":
		if !isBytes {
			checkType(t, where+"[]", obj(s["items"]), gt.Elem(), false)
		}
	case "object":
		if gt.Key().Kind() != reflect.String {
			t.Errorf("%s: map key %s is not a string", where, gt.Key())
		}
		checkType(t, where+"{}", obj(s["additionalProperties"]), gt.Elem(), false)
		if s["properties"] != nil {
			t.Errorf("%s: a map has no fixed properties", where)
		}
	}
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestDocumentHeader(t *testing.T) {
	doc := loadDoc(t)
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Errorf("openapi: %q, want 3.1.x", v)
	}
	if got := at(doc, "info", "title"); got != "berth" {
		t.Errorf("info.title: %v", got)
	}
	if got := at(doc, "info", "version"); got != "0.1.0" {
		t.Errorf("info.version: %v", got)
	}
	servers, _ := doc["servers"].([]any)
	if len(servers) == 0 || at(servers[0], "url") != "http://127.0.0.1:7680" {
		t.Errorf("servers: %v", servers)
	}
	tags, _ := doc["tags"].([]any)
	var names []string
	for _, tag := range tags {
		name, _ := at(tag, "name").(string)
		if name == "" || slices.Contains(names, name) {
			t.Errorf("tag name %q is empty or repeated", name)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		t.Error("no tags")
	}
}

func TestOpenAPIReturnsCopy(t *testing.T) {
	b := OpenAPI()
	b[0] = '#'
	if OpenAPI()[0] == '#' {
		t.Error("OpenAPI returns the embedded document itself")
	}
}

func TestSchemaTableCoversTypes(t *testing.T) {
	declared := declaredStructs(t)
	if len(declared) == 0 {
		t.Fatal("types.go declares no struct types")
	}
	inTable := map[string]bool{}
	pkgs := []string{reflect.TypeFor[Sandbox]().PkgPath(), reflect.TypeFor[FileInfo]().PkgPath()}
	for schema, typ := range schemaTypes {
		if !slices.Contains(pkgs, typ.PkgPath()) || typ.Kind() != reflect.Struct {
			t.Errorf("schemaTypes[%s] = %s, not a struct of package api or guestapi", schema, typ)
		}
		if inTable[typ.Name()] {
			t.Errorf("schemaTypes lists %s twice", typ.Name())
		}
		inTable[typ.Name()] = true
		if declared[typ.Name()] == nil {
			t.Errorf("schemaTypes[%s] = %s, which %v do not declare", schema, typ.Name(), typeFiles)
		}
	}
	for _, name := range sortedKeys(declared) {
		// Where is embedded in every file request; a build's options travel
		// as query parameters.
		if !inTable[name] && name != "Where" && name != "BuildTemplateRequest" {
			t.Errorf("%v declare struct %s, which schemaTypes (and openapi.yaml) lack", typeFiles, name)
		}
	}
	schemas := obj(at(loadDoc(t), "components", "schemas"))
	for _, name := range sortedKeys(schemaTypes) {
		if schemas[name] == nil {
			t.Errorf("openapi.yaml has no component schema %s", name)
		}
	}
	for _, name := range sortedKeys(schemas) {
		if schemaTypes[name] == nil {
			t.Errorf("component schema %s has no Go type in schemaTypes", name)
		}
	}
}

func TestSchemasMatchGoTypes(t *testing.T) {
	schemas := obj(at(loadDoc(t), "components", "schemas"))
	for _, name := range sortedKeys(schemaTypes) {
		typ := schemaTypes[name]
		s := obj(schemas[name])
		if s == nil {
			continue // reported by TestSchemaTableCoversTypes
		}
		if s["type"] != "object" {
			t.Errorf("%s: type %v, want object", name, s["type"])
		}
		props := obj(s["properties"])
		fields := jsonFields(typ)
		var names, required []string
		for _, f := range fields {
			names = append(names, f.name)
			if !f.optional {
				required = append(required, f.name)
			}
		}
		sort.Strings(names)
		sort.Strings(required)
		if got := sortedKeys(props); !slices.Equal(got, names) {
			t.Errorf("%s: properties %v, Go JSON fields %v", name, got, names)
		}
		gotRequired := strs(s["required"])
		sort.Strings(gotRequired)
		if !slices.Equal(gotRequired, required) {
			t.Errorf("%s: required %v, want the fields without omitempty/omitzero %v", name, gotRequired, required)
		}
		for _, f := range fields {
			if p, ok := props[f.name]; ok {
				checkType(t, name+"."+f.name, obj(p), f.typ, f.quoted)
			}
		}
	}
}

func TestDescriptionsFollowDocComments(t *testing.T) {
	schemas := obj(at(loadDoc(t), "components", "schemas"))
	declared := declaredStructs(t)
	for _, name := range sortedKeys(schemaTypes) {
		typ := schemaTypes[name]
		ts, s := declared[typ.Name()], obj(schemas[name])
		if ts == nil || s == nil {
			continue // reported by TestSchemaTableCoversTypes
		}
		if ts.Doc != nil {
			if d, _ := s["description"].(string); strings.TrimSpace(d) == "" {
				t.Errorf("%s: Go type has a doc comment, the schema no description", name)
			}
		}
		for _, fd := range ts.Type.(*ast.StructType).Fields.List {
			if fd.Doc == nil && fd.Comment == nil {
				continue
			}
			for _, id := range fd.Names {
				sf, _ := typ.FieldByName(id.Name)
				jsonName, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
				if jsonName == "" {
					jsonName = id.Name
				}
				p := obj(at(s, "properties", jsonName))
				if p == nil {
					continue // reported by TestSchemasMatchGoTypes
				}
				if d, _ := p["description"].(string); strings.TrimSpace(d) == "" {
					t.Errorf("%s.%s: Go field %s has a doc comment, the property no description", name, jsonName, id.Name)
				}
			}
		}
	}
}

func TestEnumsMatchConstants(t *testing.T) {
	doc := loadDoc(t)
	blocks := declaredConsts(t)
	values := func(block map[string]string) []string {
		var out []string
		for _, v := range block {
			out = append(out, v)
		}
		sort.Strings(out)
		return out
	}
	enumOf := func(schema, prop string) []string {
		e := strs(at(doc, "components", "schemas", schema, "properties", prop, "enum"))
		sort.Strings(e)
		return e
	}
	for _, c := range enumConsts {
		var want []string
		for _, m := range c.members {
			i := slices.IndexFunc(blocks, func(b map[string]string) bool { _, ok := b[m]; return ok })
			if i < 0 {
				t.Errorf("%v declare no const %s", typeFiles, m)
				continue
			}
			want = append(want, values(blocks[i])...)
		}
		sort.Strings(want)
		if got := enumOf(c.schema, c.property); !slices.Equal(got, want) {
			t.Errorf("%s.%s: enum %v, the constants of the blocks of %v are %v", c.schema, c.property, got, c.members, want)
		}
	}

	var classes []string
	for _, b := range constBlocks(t, parseGo(t, "../errdefs/errdefs.go"), "Class") {
		classes = append(classes, values(b)...)
	}
	sort.Strings(classes)
	if len(classes) == 0 {
		t.Fatal("errdefs.go declares no classes")
	}
	for _, c := range classes {
		if !errdefs.Known(c) {
			t.Errorf("errdefs const %q is not Known", c)
		}
	}
	if got := enumOf("Error", "class"); !slices.Equal(got, classes) {
		t.Errorf("Error.class: enum %v, errdefs classes %v", got, classes)
	}

	var reasons []string
	for _, b := range constBlocks(t, parseGo(t, "../errdefs/errdefs.go"), "Reason") {
		reasons = append(reasons, values(b)...)
	}
	sort.Strings(reasons)
	if len(reasons) == 0 {
		t.Fatal("errdefs.go declares no reasons")
	}
	for _, r := range reasons {
		if !errdefs.KnownReason(r) {
			t.Errorf("errdefs reason %q is not KnownReason", r)
		}
	}
	if got := enumOf("Error", "reason"); !slices.Equal(got, reasons) {
		t.Errorf("Error.reason: enum %v, errdefs reasons %v", got, reasons)
	}
}

func TestRefsResolve(t *testing.T) {
	doc := loadDoc(t)
	used := map[string]bool{}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch c := v.(type) {
		case map[string]any:
			if ref, ok := c["$ref"]; ok {
				s, isString := ref.(string)
				if !isString {
					t.Errorf("%s: $ref %v is not a string", where, ref)
				} else if _, err := resolve(doc, s); err != nil {
					t.Errorf("%s: %v", where, err)
				}
				used[s] = true
			}
			for _, k := range sortedKeys(c) {
				walk(where+"/"+k, c[k])
			}
		case []any:
			for i, e := range c {
				walk(where+"/"+strconv.Itoa(i), e)
			}
		}
	}
	walk("#", doc)
	for _, kind := range []string{"schemas", "responses", "parameters"} {
		for _, name := range sortedKeys(obj(at(doc, "components", kind))) {
			if ref := "#/components/" + kind + "/" + name; !used[ref] {
				t.Errorf("%s is never referenced", ref)
			}
		}
	}
}

var (
	templateParam = regexp.MustCompile(`\{([^{}]+)\}`)
	success       = regexp.MustCompile(`^2[0-9][0-9]$`)
	failure       = regexp.MustCompile(`^[45][0-9][0-9]$`)
)

func TestOperations(t *testing.T) {
	doc := loadDoc(t)
	if ref := at(doc, "components", "schemas", "ErrorResponse", "properties", "error", "$ref"); ref != schemaPrefix+"Error" {
		t.Errorf("ErrorResponse.error: $ref %v, want %sError", ref, schemaPrefix)
	}
	var tags []string
	tagList, _ := doc["tags"].([]any)
	for _, tag := range tagList {
		tags = append(tags, fmt.Sprint(at(tag, "name")))
	}
	ids := map[string]string{}
	paths := obj(doc["paths"])
	if len(paths) == 0 {
		t.Fatal("no paths")
	}
	for _, path := range sortedKeys(paths) {
		item := obj(paths[path])
		for _, key := range sortedKeys(item) {
			if !slices.Contains(operationMethods, key) {
				if !slices.Contains([]string{"parameters", "summary", "description", "servers"}, key) {
					t.Errorf("%s: unexpected key %q", path, key)
				}
				continue
			}
			op := obj(item[key])
			where := strings.ToUpper(key) + " " + path

			id, _ := op["operationId"].(string)
			if id == "" {
				t.Errorf("%s: no operationId", where)
			} else if prev, dup := ids[id]; dup {
				t.Errorf("%s: operationId %q is also %s's", where, id, prev)
			} else {
				ids[id] = where
			}

			opTags := strs(op["tags"])
			if len(opTags) == 0 {
				t.Errorf("%s: no tags", where)
			}
			for _, tag := range opTags {
				if !slices.Contains(tags, tag) {
					t.Errorf("%s: tag %q is not declared", where, tag)
				}
			}

			// Path parameters: exactly the names of the template, required.
			inPath := map[string]bool{}
			pathLevel, _ := item["parameters"].([]any)
			opLevel, _ := op["parameters"].([]any)
			for _, p := range slices.Concat(pathLevel, opLevel) {
				param := deref(t, doc, p)
				if param["in"] == "path" {
					inPath[fmt.Sprint(param["name"])] = true
					if param["required"] != true {
						t.Errorf("%s: path parameter %v is not required", where, param["name"])
					}
				}
				if param["schema"] == nil {
					t.Errorf("%s: parameter %v has no schema", where, param["name"])
				}
			}
			var template []string
			for _, m := range templateParam.FindAllStringSubmatch(path, -1) {
				template = append(template, m[1])
			}
			if got := sortedKeys(inPath); !slices.Equal(got, slices.Sorted(slices.Values(template))) {
				t.Errorf("%s: path parameters %v, template has %v", where, got, template)
			}

			if rb := op["requestBody"]; rb != nil {
				content := obj(deref(t, doc, rb)["content"])
				ref, _ := at(content, "application/json", "schema", "$ref").(string)
				binary := false
				for _, ct := range []string{"application/octet-stream", "application/x-tar"} {
					binary = binary || at(content, ct, "schema", "format") == "binary"
				}
				if !strings.HasPrefix(ref, schemaPrefix) && !binary {
					t.Errorf("%s: request body is neither application/json with a component schema nor binary", where)
				}
			}

			responses := obj(op["responses"])
			var ok2xx bool
			for _, code := range sortedKeys(responses) {
				resp := deref(t, doc, responses[code])
				content := obj(resp["content"])
				switch {
				case success.MatchString(code):
					ok2xx = true
					if code == "204" && content != nil {
						t.Errorf("%s: 204 with content", where)
					}
					// A relayed answer is the server inside's: no schema.
					if code != "204" && content == nil && op["x-relayed"] != true {
						t.Errorf("%s: %s without content", where, code)
					}
					if s := content["application/x-ndjson"]; s != nil {
						if ref := at(s, "schema", "$ref"); ref != schemaPrefix+"ExecEvent" && ref != schemaPrefix+"WatchEvent" && ref != schemaPrefix+"EgressRecord" && ref != schemaPrefix+"PullEvent" && ref != schemaPrefix+"BuildEvent" {
							t.Errorf("%s: NDJSON items are %v, want ExecEvent, WatchEvent, EgressRecord, PullEvent or BuildEvent", where, ref)
						}
					}
					if s := content["text/event-stream"]; s != nil {
						if ref := at(s, "schema", "$ref"); ref != schemaPrefix+"SandboxEvent" {
							t.Errorf("%s: event stream data is %v, want SandboxEvent", where, ref)
						}
					}
				case failure.MatchString(code) || code == "default":
					if len(content) != 1 || at(content, "application/json", "schema", "$ref") != schemaPrefix+"ErrorResponse" {
						t.Errorf("%s: %s response is not application/json ErrorResponse", where, code)
					}
					if code == "default" {
						continue
					}
					classes := strs(resp["x-error-classes"])
					if len(classes) == 0 {
						t.Errorf("%s: %s response names no x-error-classes", where, code)
					}
					status, _ := strconv.Atoi(code)
					for _, c := range classes {
						if !errdefs.Known(c) {
							t.Errorf("%s: %s: unknown class %q", where, code, c)
						} else if got := errdefs.HTTPStatus(errdefs.Class(c)); got != status && (status != http.StatusBadGateway || op["x-relayed"] != true) {
							// (A relay that breaks is 502 whatever its class.)
							t.Errorf("%s: %s carries class %s, whose status is %d", where, code, c, got)
						}
					}
				case code == "101" && op["x-relayed"] == true:
					ok2xx = true // an upgrade the proxy relays
				default:
					t.Errorf("%s: response code %q", where, code)
				}
			}
			if !ok2xx {
				t.Errorf("%s: no 2xx response", where)
			}
		}
	}
}

func TestRoutes(t *testing.T) {
	routes, err := Routes()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(routes, wantRoutes) {
		t.Errorf("Routes():\n%v\nwant\n%v", routes, wantRoutes)
	}
	// The operations of the first API cut, among them.
	for _, r := range []string{
		"GET /healthz", "GET /v1/version", "POST /v1/sandboxes", "GET /v1/sandboxes",
		"GET /v1/sandboxes/{id}", "DELETE /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/exec",
		"POST /v1/sandboxes/{id}/processes", "GET /v1/sandboxes/{id}/processes",
		"GET /v1/sandboxes/{id}/processes/{pid}", "DELETE /v1/sandboxes/{id}/processes/{pid}",
		"GET /v1/sandboxes/{id}/processes/{pid}/output", "POST /v1/sandboxes/{id}/processes/{pid}/wait",
		"POST /v1/sandboxes/{id}/processes/{pid}/signal",
	} {
		if !slices.ContainsFunc(routes, func(x Route) bool { return x.String() == r }) {
			t.Errorf("Routes() lacks %s", r)
		}
	}
}

func TestJSONFields(t *testing.T) {
	type inner struct {
		A string `json:"a"`
		B int    `json:"b,omitempty"`
	}
	type Named struct {
		C bool `json:"c"`
	}
	type outer struct {
		inner
		*Named `json:"named,omitzero"`
		A      string `json:"a,omitempty"` // shadows inner.A
		Skip   string `json:"-"`
		Dash   string `json:"-,"`
		hidden string
		Bare   int64     `json:",string"`
		Struct inner     `json:"struct,omitempty"` // omitempty never omits a struct
		Zero   time.Time `json:"zero,omitzero"`
	}
	var got []string
	for _, f := range jsonFields(reflect.TypeFor[outer]()) {
		got = append(got, fmt.Sprintf("%s:%v:%v", f.name, f.optional, f.quoted))
	}
	sort.Strings(got)
	want := []string{"-:false:false", "Bare:false:true", "a:true:false", "b:true:false", "named:true:false", "struct:false:false", "zero:true:false"}
	if !slices.Equal(got, want) {
		t.Errorf("jsonFields: %v, want %v", got, want)
	}
	_ = outer{hidden: ""}
}
