// Package e2b holds the wire contract of E2B's in-sandbox agent, envd, that
// berth serves for E2B's SDKs (package compat/e2b): the published .proto
// files of its process and filesystem services, unchanged, and the Go code
// protoc generates from them (generate.sh; committed, and checked against
// the .proto files by this package's test).
package e2b
