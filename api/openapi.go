package api

import (
	"bytes"
	_ "embed"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPI returns the OpenAPI 3.1 document of the API (YAML). The caller owns
// the returned slice.
func OpenAPI() []byte { return bytes.Clone(openapiYAML) }

// Route is one operation of the OpenAPI document.
type Route struct {
	// Method is the HTTP method in upper case.
	Method string
	// Path is the OpenAPI path template, e.g. /v1/sandboxes/{id}.
	Path string
}

// String renders the route as "METHOD /path", the form of a net/http pattern.
func (r Route) String() string { return r.Method + " " + r.Path }

// operationMethods are the keys of an OpenAPI path item that name operations.
var operationMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// Routes returns every operation of the OpenAPI document, sorted by path and
// then method.
func Routes() ([]Route, error) {
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	var routes []Route
	for path, item := range doc.Paths {
		if !strings.HasPrefix(path, "/") {
			return nil, fmt.Errorf("openapi.yaml: path %q does not start with /", path)
		}
		for key := range item {
			if slices.Contains(operationMethods, key) {
				routes = append(routes, Route{Method: strings.ToUpper(key), Path: path})
			}
		}
	}
	slices.SortFunc(routes, func(a, b Route) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return routes, nil
}
