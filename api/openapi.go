package api

import (
	_ "embed"
	"fmt"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPI returns the OpenAPI document of the API.
func OpenAPI() []byte { return append([]byte(nil), openapiYAML...) }

// Route is one documented operation.
type Route struct {
	Method string // upper case
	Path   string // OpenAPI template, e.g. /v1/sandboxes/{id}
}

// Routes lists the operations the document describes, sorted.
func Routes() ([]Route, error) {
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		return nil, fmt.Errorf("parse openapi.yaml: %w", err)
	}
	var out []Route
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "post", "put", "patch", "delete", "head", "options":
				out = append(out, Route{Method: strings.ToUpper(method), Path: path})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out, nil
}
