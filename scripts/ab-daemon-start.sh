#!/bin/bash
# A/B of the daemon's own start: two berth binaries, started in alternating
# order, each from exec to its first answer on GET /healthz (no warm pool,
# no spare guests: the daemon alone). Run as root from anywhere:
#
#     scripts/ab-daemon-start.sh OLD_BERTH NEW_BERTH [ROUNDS] [restart]
#
# Each start gets a fresh state directory; with "restart" the same binary
# starts in it once before the timed start, as after a reboot of the daemon.
# docs/benchmarks.md quotes its output.
set -euo pipefail
old=$1 new=$2 rounds=${3:-20} mode=${4:-fresh}
port=17999
root=$(mktemp -d /var/tmp/berth-ab-XXXXXX)
chmod 711 "$root"
trap 'rm -rf "$root"' EXIT

serve() { # binary state
  "$1" serve --state-dir "$2" --listen 127.0.0.1:$port --warm-pool 0 --spare-guests 0 >>"$2.log" 2>&1 &
  pid=$!
  until curl -sf -o /dev/null http://127.0.0.1:$port/healthz; do
    kill -0 $pid 2>/dev/null || { echo "$1 exited: see $2.log" >&2; exit 1; }
    sleep 0.002
  done
}

one() { # name binary -> "name microseconds"
  local state
  state=$(mktemp -d "$root/s-XXXXXX")
  chmod 711 "$state"
  if [ "$mode" = restart ]; then
    serve "$2" "$state"; kill $pid; wait $pid || true
  fi
  local t0 t1
  t0=$(date +%s%N)
  serve "$2" "$state"
  t1=$(date +%s%N)
  kill $pid; wait $pid || true
  rm -rf "$state" "$state.log"
  echo "$1 $(( (t1 - t0) / 1000 ))"
}

for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 0 ]; then one old "$old"; one new "$new"; else one new "$new"; one old "$old"; fi
done | python3 -c '
import statistics, sys
r = {}
for line in sys.stdin:
    k, v = line.split()
    r.setdefault(k, []).append(int(v) / 1000)
for k in ("old", "new"):
    v = sorted(r[k])
    print(f"{k}: p50 {statistics.median(v):.1f} ms  p90 {v[int(len(v) * .9)]:.1f}  n {len(v)}")'
