"""Fixtures: a real `berth serve` on loopback, and E2B's SDK pointed at it
the way docs/e2b.md tells users to: E2B_API_URL and E2B_SANDBOX_URL set to
the daemon's URL, and E2B_API_KEY to a berth API key (here the admin key the
daemon writes to <state>/admin.key on its first start), as a real E2B user
sets theirs.

The daemon binary is $BERTH_BINARY (make test builds it), else bin/berth.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon() -> tuple[subprocess.Popen, str, str, str]:
    """Starts berth serve; returns the process, its URL, state dir and admin key."""
    binary = os.environ.get("BERTH_BINARY") or str(REPO / "bin" / "berth")
    if not os.path.exists(binary):
        pytest.fail(f"no berth binary at {binary}: run make build (or set BERTH_BINARY)")
    root = os.environ.get("BERTH_TEST_STATE_ROOT", "/var/tmp/berth-test")
    os.makedirs(root, exist_ok=True)
    state = tempfile.mkdtemp(prefix="e2b-", dir=root)
    os.chmod(state, 0o755)  # sandboxes (unprivileged uids) must traverse it
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(os.path.join(state, "daemon.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(  # noqa: S603
        [binary, "serve", "--listen", url[len("http://"):], "--state-dir", state, "--warm-pool", "2"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:  # noqa: S310
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"berth serve did not start: {Path(state, 'daemon.log').read_text()[-2000:]}")
        time.sleep(0.05)
    # The daemon writes its first admin key before it answers /healthz.
    key = Path(state, "admin.key").read_text().strip()
    if not key:
        proc.kill()
        pytest.fail(f"berth serve wrote no admin key to {state}/admin.key")
    return proc, url, state, key


@pytest.fixture(scope="session")
def berth_url() -> Iterator[str]:
    proc, url, state, key = start_daemon()
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    os.environ["E2B_API_KEY"] = key
    try:
        yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def admin_key(berth_url: str) -> str:
    """The daemon's admin key (the session's E2B_API_KEY)."""
    return os.environ["E2B_API_KEY"]
