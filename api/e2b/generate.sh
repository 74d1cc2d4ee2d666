#!/usr/bin/env bash
# Regenerates the Go code of envd's published .proto files (copied unchanged
# from github.com/e2b-dev/E2B, spec/envd, at commit b8029973aa7d). Needs
# protoc (Debian: protobuf-compiler) and the two plugins at the versions
# go.mod pins:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
# The generated files are committed; api/e2b's test fails when they drift
# from the .proto files.
set -euo pipefail
cd "$(dirname "$0")/envd"
mod=github.com/berthsh/berth/api/e2b/envd
protoc -I . \
  --go_out=. --go_opt=paths=source_relative \
  --go_opt=Mprocess/process.proto=$mod/process \
  --go_opt=Mfilesystem/filesystem.proto=$mod/filesystem \
  --connect-go_out=. --connect-go_opt=paths=source_relative \
  --connect-go_opt=Mprocess/process.proto=$mod/process \
  --connect-go_opt=Mfilesystem/filesystem.proto=$mod/filesystem \
  process/process.proto filesystem/filesystem.proto
