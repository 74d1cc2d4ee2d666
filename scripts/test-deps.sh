#!/usr/bin/env bash
# Installs the Debian packages whose programs berth's tests run inside
# sandboxes (a sandbox sees only the host's /usr, so a Python or procps
# installed elsewhere, pyenv or /usr/local, does not count), and e2fsprogs,
# whose mkfs.ext4 the daemon runs for sandboxes with a disk limit, and
# iproute2, whose ip the network tests use to build their namespaces,
# tmux, the real terminal the test of berth shell types into, and xfsprogs,
# whose mkfs.xfs makes the file system on which layerdiff's test of a copy
# checks reflinks.
set -euo pipefail
need=()
/usr/bin/python3 -c 'import ctypes, socket, http.server' 2>/dev/null || need+=(python3)
[ -x /usr/bin/python ] || need+=(python-is-python3)          # LangChain's sandbox suite runs `python`
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)  # the SDK's test venv
[ -x /usr/bin/ps ] || need+=(procps)
{ [ -x /usr/bin/su ] && [ -x /usr/bin/unshare ]; } || need+=(util-linux)
command -v mkfs.ext4 >/dev/null || [ -x /sbin/mkfs.ext4 ] || need+=(e2fsprogs)
[ -x /usr/bin/curl ] || need+=(curl)                               # network tests run curl inside sandboxes
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)  # and pip download from a test index
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need+=(iproute2)         # the network tests' own namespaces
[ -x /usr/bin/tmux ] || need+=(tmux)                               # a real terminal for berth shell's test
command -v mkfs.xfs >/dev/null || [ -x /sbin/mkfs.xfs ] || need+=(xfsprogs)  # an XFS with reflinks for layerdiff's copy test
[ -x /usr/bin/bash ] || need+=(bash)                               # the shell berth shell starts
[ -x /usr/bin/mmdebstrap ] || need+=(mmdebstrap)                   # builds the Debian image the image tests push
[ -x /usr/bin/dpkg-deb ] || need+=(dpkg)                           # and the .deb they install inside it
command -v gcc >/dev/null || need+=(gcc)                          # cgo builds of berth, which doctor, serve and the runtimes refuse
[ -x /usr/bin/chromium ] || need+=(chromium)                       # the headless browser of the dashboard's test (e2e/dashboard_test.go)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
		echo "tests need: ${need[*]} (install them, as root, with your package manager)" >&2
		exit 1
	fi
	echo "test-deps: installing these Debian packages on this host (tests run their programs inside sandboxes, which see the host's /usr): ${need[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The Debian image of the image tests: bookworm, minbase, with python3 and
# pip, from Debian's archive (no container registry is needed or used),
# built once (about 20 s and 250 MB) and cached by version outside the clone.
# The tests push it to a registry they run on loopback.
debian_image_version=v1
cache=${BERTH_TEST_CACHE:-/var/cache/berth-test}
image=$cache/debian-bookworm-python-$debian_image_version.tar
if [ ! -s "$image" ]; then
	mkdir -p "$cache"
	echo "test-deps: building the Debian test image $image from deb.debian.org (once)" >&2
	rm -f "$cache"/.debian-*.tar
	tmp=$(mktemp "$cache/.debian-XXXXXX.tar")
	mmdebstrap --quiet --variant=minbase --include=python3,python3-pip bookworm "$tmp" http://deb.debian.org/debian
	mv "$tmp" "$image"
fi

# E2B's JavaScript SDK (make test-e2b) needs Node 20.18.1 or newer and npm;
# Debian 12's nodejs is older, so this is a host prerequisite, not a package
# this script installs.
if ! node -e 'const [a,b,c]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&(b>18||(b===18&&c>=1)))?0:1)' 2>/dev/null || ! command -v npm >/dev/null; then
	echo "tests need Node.js >= 20.18.1 with npm on PATH (E2B's JavaScript SDK runs against berth); have: $(node --version 2>/dev/null || echo none)" >&2
	exit 1
fi
