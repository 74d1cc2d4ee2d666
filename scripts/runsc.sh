#!/usr/bin/env bash
# Builds gVisor's runsc, the gvisor runtime's OCI runtime, from the Go module
# proxy at the version go.mod pins for gvisor.dev/gvisor (berth's netstack
# comes from the same module), static (CGO_ENABLED=0: a cgo build cannot
# start its sandbox), once per version, into a cache outside the clone, and
# prints its path. About a minute the first time; instant after.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
cache=${BERTH_TEST_CACHE:-/var/cache/berth-test}
dir=$cache/runsc-$version
if [ ! -x "$dir/runsc" ]; then
	echo "runsc: building gvisor.dev/gvisor/runsc@$version into $dir (once)" >&2
	mkdir -p "$dir"
	tmp=$(mktemp -d "$cache/.runsc-XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN=$tmp CGO_ENABLED=0 go install "gvisor.dev/gvisor/runsc@$version" >&2
	mv "$tmp/runsc" "$dir/runsc"
fi
chmod 0755 "$cache" "$dir" "$dir/runsc"
echo "$dir/runsc"
