"""Fixtures: a real `berth serve` on loopback for the whole session.

The daemon binary is $BERTH_BINARY (make test builds it), else bin/berth of
the repository. It runs as root (sandboxes need it) with a state directory
of its own, and is stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth import Berth

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def berth_url() -> Iterator[str]:
    binary = os.environ.get("BERTH_BINARY") or str(REPO / "bin" / "berth")
    if not os.path.exists(binary):
        pytest.fail(f"no berth binary at {binary}: run make build (or set BERTH_BINARY)")
    root = os.environ.get("BERTH_TEST_STATE_ROOT", "/var/tmp/berth-test")
    os.makedirs(root, exist_ok=True)
    state = tempfile.mkdtemp(prefix="sdk-", dir=root)
    os.chmod(state, 0o755)  # sandboxes (unprivileged uids) must traverse it
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(os.path.join(state, "daemon.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(  # noqa: S603
        [binary, "serve", "--listen", url[len("http://") :], "--state-dir", state, "--warm-pool", "4"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"berth serve did not start: {Path(state, 'daemon.log').read_text()[-2000:]}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def client(berth_url: str) -> Iterator[Berth]:
    with Berth(berth_url) as c:
        yield c
