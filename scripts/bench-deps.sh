#!/usr/bin/env bash
# Installs the peers `make bench` compares berth with (Debian packages),
# when missing. A peer that cannot be installed is reported by the bench as
# "not measured (why)"; this script never fails the run for it.
set -uo pipefail
need=()
for pair in crun:crun runc:runc bwrap:bubblewrap podman:podman; do
	cmd=${pair%%:*} pkg=${pair#*:}
	command -v "$cmd" >/dev/null || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
	echo "bench peers missing: ${need[*]} (not installed: no root or no apt-get)" >&2
	exit 0
fi
echo "installing bench peers: ${need[*]}" >&2
apt-get update -qq || true
for pkg in "${need[@]}"; do
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null || echo "could not install $pkg" >&2
done
exit 0
