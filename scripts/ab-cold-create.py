#!/usr/bin/env python3
"""A/B of cold creates: two berth binaries, each a daemon without a warm pool,
measured in alternating order in one run (create -> first `echo hi` output
through the Python SDK, then delete), so that the machine's noise falls on
both alike. Run as root from the repository:

    sdk/python/.venv/bin/python scripts/ab-cold-create.py OLD_BERTH NEW_BERTH [ROUNDS] [-- SERVE_FLAGS...]

docs/benchmarks.md quotes its output for the changes to cold creates.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sdk", "python", "src"))
from berth import Berth  # noqa: E402


def start(binary, port, flags):
    root = os.environ.get("BERTH_TEST_STATE_ROOT", "/var/tmp/berth-test")
    os.makedirs(root, exist_ok=True)
    state = tempfile.mkdtemp(prefix="ab-", dir=root)
    os.chmod(state, 0o755)
    log = open(os.path.join(state, "log"), "wb")
    proc = subprocess.Popen([binary, "serve", "--state-dir", state, "--listen", f"127.0.0.1:{port}",
                             "--warm-pool", "0", *flags], stdout=log, stderr=subprocess.STDOUT)
    key = os.path.join(state, "admin.key")
    for _ in range(400):
        if os.path.exists(key):
            try:
                c = Berth(f"http://127.0.0.1:{port}", api_key=open(key).read().strip())
                c.list()
                return proc, c, state
            except Exception:
                pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{binary} did not answer (log: {state}/log)")


def main():
    args = sys.argv[1:]
    flags = []
    if "--" in args:
        i = args.index("--")
        args, flags = args[:i], args[i + 1:]
    if len(args) < 2:
        raise SystemExit(__doc__)
    rounds = int(args[2]) if len(args) > 2 else 100
    daemons = {"old": start(args[0], 17791, flags), "new": start(args[1], 17792, flags)}
    res = {k: [] for k in daemons}
    try:
        for r in range(rounds):
            for k in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
                c = daemons[k][1]
                t0 = time.perf_counter()
                sb = c.create()
                sb.exec(["/usr/bin/echo", "hi"])
                res[k].append((time.perf_counter() - t0) * 1000)
                sb.delete()
                time.sleep(0.02)  # spares (and nothing else) refill between samples
    finally:
        for proc, _, state in daemons.values():
            proc.terminate()
            proc.wait()
            subprocess.run(["rm", "-rf", state])
    for k, v in res.items():
        v.sort()
        print(f"{k}: p50 {statistics.median(v):.2f} ms  p90 {v[int(len(v) * .9)]:.2f}  "
              f"p99 {v[int(len(v) * .99)]:.2f}  n {len(v)}")


if __name__ == "__main__":
    main()
