"""The E2B bench's client: E2B's own Python SDK (e2b from PyPI, unchanged)
and berth's native API (httpx), from one process against one daemon, so that
only the protocol differs.

The SDK finds berth through E2B_API_URL and E2B_SANDBOX_URL (the bench sets
both to the daemon's URL, and any E2B_API_KEY). The bench drives this
program one sample at a time, a command a line on standard input, so that
it can wait for the daemon's warm pool to refill between samples; each
answer is one line of JSON on standard output:

    create e2b       Sandbox.create(), then commands.run("echo hi") until
                     its output is in hand: {"ms": …}. The sandbox is
                     killed after the clock stops.
    create native    the same through berth's API: POST /v1/sandboxes, then
                     POST …/exec of /bin/bash -l -c "echo hi" (what
                     commands.run starts): {"ms": …}.
    open             Sandbox.create() of the sandbox the next execs use:
                     {"id": …}.
    exec ROUNDS WARM in that sandbox, WARM unmeasured calls of each, then
                     ROUNDS rounds of one commands.run("true") and one
                     POST …/exec of /bin/bash -l -c true, which of the two
                     goes first alternating: {"e2b": […], "native": […]},
                     milliseconds in round order.
    close            kills that sandbox: {}.

The first line, before any command, is {"e2b": VERSION}: the SDK imported.
Every answer is checked (the output, the exit code); a failure is
{"error": …}, and the bench reports it. Standard input's end ends the
program, with the open sandbox killed.
"""

import base64
import importlib.metadata
import json
import os
import sys
import time

import httpx
from e2b import Sandbox

URL = os.environ["E2B_API_URL"]

# One client for the native API, kept alive across calls like the SDK's
# own connection pool.
# berth's key is the E2B_API_KEY the SDK sends; the native API takes it as
# a bearer token.
native = httpx.Client(base_url=URL, timeout=60, headers={"Authorization": "Bearer " + os.environ["E2B_API_KEY"]})


def bash(cmd):
    return {"cmd": ["/bin/bash", "-l", "-c", cmd]}


def native_exec(sid, cmd):
    r = native.post(f"/v1/sandboxes/{sid}/exec", json=bash(cmd))
    r.raise_for_status()
    res = r.json()
    if res["exit_code"] != 0:
        raise RuntimeError(f"exec of {cmd!r} exited {res['exit_code']}: {res.get('error', '')}")
    return base64.b64decode(res["stdout"] or b"").decode()


def e2b_exec(sbx, cmd):
    r = sbx.commands.run(cmd)
    if r.exit_code != 0:
        raise RuntimeError(f"commands.run({cmd!r}) exited {r.exit_code}")
    return r.stdout


def want_hi(out):
    if out != "hi\n":
        raise RuntimeError(f"output {out!r}, want 'hi\\n'")


def create_e2b():
    t0 = time.perf_counter()
    sbx = Sandbox.create()
    try:
        want_hi(e2b_exec(sbx, "echo hi"))
        return {"ms": (time.perf_counter() - t0) * 1e3}
    finally:
        sbx.kill()


def create_native():
    t0 = time.perf_counter()
    r = native.post("/v1/sandboxes", json={})
    r.raise_for_status()
    sid = r.json()["id"]
    try:
        want_hi(native_exec(sid, "echo hi"))
        return {"ms": (time.perf_counter() - t0) * 1e3}
    finally:
        native.delete(f"/v1/sandboxes/{sid}")


def execs(sbx, rounds, warm):
    if sbx is None:
        raise RuntimeError("exec before open")
    sid = sbx.sandbox_id
    for _ in range(warm):
        e2b_exec(sbx, "true")
        native_exec(sid, "true")
    got = {"e2b": [], "native": []}
    calls = [("e2b", lambda: e2b_exec(sbx, "true")), ("native", lambda: native_exec(sid, "true"))]
    for r in range(rounds):
        for name, call in calls[r % 2 :] + calls[: r % 2]:
            t0 = time.perf_counter()
            call()
            got[name].append((time.perf_counter() - t0) * 1e3)
    return got


class Session:
    """The commands of one run, and the sandbox open between open and close."""

    def __init__(self):
        self.sbx = None

    def answer(self, line):
        f = line.split()
        if f == ["create", "e2b"]:
            return create_e2b()
        if f == ["create", "native"]:
            return create_native()
        if f == ["open"]:
            self.close()
            self.sbx = Sandbox.create()
            return {"id": self.sbx.sandbox_id}
        if len(f) == 3 and f[0] == "exec":
            return execs(self.sbx, int(f[1]), int(f[2]))
        if f == ["close"]:
            self.close()
            return {}
        raise RuntimeError(f"unknown command {line!r}")

    def close(self):
        if self.sbx is not None:
            sbx, self.sbx = self.sbx, None
            sbx.kill()


def main():
    print(json.dumps({"e2b": importlib.metadata.version("e2b")}), flush=True)
    session = Session()
    try:
        for line in sys.stdin:
            try:
                out = session.answer(line.strip())
            except Exception as e:  # noqa: BLE001 - every failure is reported, the next command still runs
                out = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(out), flush=True)
    finally:
        session.close()


if __name__ == "__main__":
    main()
