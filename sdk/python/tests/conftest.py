"""Fixtures: a real `berth serve` on loopback for the whole session.

The daemon binary is $BERTH_BINARY (make test builds it), else bin/berth of
the repository. It runs as root (sandboxes need it) with a state directory
of its own, and is stopped at the end. Its TCP API wants an API key: the
admin key it writes to <state>/admin.key on its first start goes into
$BERTH_API_KEY for the session, so that every client (the SDK's default),
the agents' tests and the examples they run send it, as a user would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth import AsyncBerth, Berth

from _over_async import Loop, Over

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NET_WEB = "203.0.113.10"


@pytest.fixture(scope="session")
def egress_netns() -> Iterator[str]:
    """A network namespace standing in for the internet: an HTTP server on
    203.0.113.10:8080 and nothing else (the daemon's --egress-netns)."""
    name = f"berth-sdk-{os.getpid()}"
    ip = ["ip", "netns"]

    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True)  # noqa: S603

    run(*ip, "add", name)
    server = None
    try:
        run("ip", "-n", name, "link", "set", "lo", "up")
        run("ip", "-n", name, "addr", "add", NET_WEB + "/32", "dev", "lo")
        run("ip", "-n", name, "link", "add", "egress0", "type", "veth", "peer", "name", "egress1")
        run("ip", "-n", name, "link", "set", "egress0", "up")
        run("ip", "-n", name, "route", "add", "default", "dev", "egress0")
        web = tempfile.mkdtemp(prefix="sdk-web-")
        Path(web, "hello.txt").write_text("hello from the test net\n")
        server = subprocess.Popen(  # noqa: S603
            [*ip, "exec", name, "python3", "-m", "http.server", "--bind", NET_WEB, "--directory", web, "8080"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        probe = "import socket; socket.create_connection(('" + NET_WEB + "', 8080), timeout=1)"
        deadline = time.monotonic() + 10
        while subprocess.run([*ip, "exec", name, "python3", "-c", probe], capture_output=True).returncode != 0:  # noqa: S603
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the test net's HTTP server did not start")
            time.sleep(0.05)
        yield f"/run/netns/{name}"
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        subprocess.run([*ip, "del", name], capture_output=True)  # noqa: S603


@dataclass
class Daemon:
    """The session's daemon: its TCP URL, its state directory and the admin
    key it wrote there."""

    url: str
    state: str
    admin_key: str

    @property
    def socket_url(self) -> str:
        """The URL of its API's unix socket."""
        return "unix://" + os.path.join(self.state, "berth.sock")


@pytest.fixture(scope="session")
def daemon(egress_netns: str) -> Iterator[Daemon]:
    binary = os.environ.get("BERTH_BINARY") or str(REPO / "bin" / "berth")
    if not os.path.exists(binary):
        pytest.fail(f"no berth binary at {binary}: run make build (or set BERTH_BINARY)")
    root = os.environ.get("BERTH_TEST_STATE_ROOT", "/var/tmp/berth-test")
    os.makedirs(root, exist_ok=True)
    state = tempfile.mkdtemp(prefix="sdk-", dir=root)
    os.chmod(state, 0o755)  # sandboxes (unprivileged uids) must traverse it
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(os.path.join(state, "daemon.log"), "wb")  # noqa: SIM115
    args = [binary, "serve", "--listen", url[len("http://") :], "--state-dir", state, "--warm-pool", "4",
            "--egress-netns", egress_netns, "--egress-dns", "203.0.113.53"]
    # BERTH_TEST_RUNTIME runs the suite on another runtime (make test runs it
    # on native and on gvisor, with the runsc make installs).
    if rt := os.environ.get("BERTH_TEST_RUNTIME"):
        args += ["--default-runtime", rt]
    if runsc := os.environ.get("BERTH_RUNSC"):
        args += ["--runsc", runsc]
    proc = subprocess.Popen(  # noqa: S603
        args,
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
        # The daemon writes the key before it answers /healthz.
        key = Path(state, "admin.key").read_text().strip()
        if not key:
            pytest.fail(f"berth serve wrote no admin key to {state}/admin.key")
        saved = os.environ.get("BERTH_API_KEY")
        os.environ["BERTH_API_KEY"] = key
        try:
            yield Daemon(url, state, key)
        finally:
            if saved is None:
                os.environ.pop("BERTH_API_KEY", None)
            else:
                os.environ["BERTH_API_KEY"] = saved
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
def berth_url(daemon: Daemon) -> str:
    return daemon.url


@pytest.fixture(scope="session")
def admin_key(daemon: Daemon) -> str:
    """The daemon's admin key (also the session's $BERTH_API_KEY)."""
    return daemon.admin_key


@pytest.fixture(scope="session")
def sync_client(berth_url: str) -> Iterator[Berth]:
    with Berth(berth_url) as c:
        yield c


# Every test that takes `client` runs with the sync client and again with
# the async one behind the sync one's face (tests/_over_async.py), so one
# suite checks both; on another runtime (BERTH_TEST_RUNTIME) the sync run is
# enough, the clients being the same code above the daemon.
_CLIENTS = ["sync"] if os.environ.get("BERTH_TEST_RUNTIME") else ["sync", "async"]


@pytest.fixture(scope="session", params=_CLIENTS)
def client(request: pytest.FixtureRequest, sync_client: Berth, berth_url: str) -> Iterator[Berth]:
    if request.param == "sync":
        yield sync_client
        return
    loop = Loop()
    c = AsyncBerth(berth_url)
    try:
        yield Over(c, loop)  # type: ignore[misc]
    finally:
        loop.run(c.aclose())
        loop.close()


@pytest.fixture
def client_with(
    client: Berth, berth_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str | None], Berth]]:
    """Makes clients of the daemon of `client`'s kind (sync, or async behind
    the sync face) with another API key; None makes one with no key at all,
    as a user without $BERTH_API_KEY has. They are closed at the test's end."""
    made: list[Any] = []

    def make(api_key: str | None) -> Berth:
        with monkeypatch.context() as m:
            m.delenv("BERTH_API_KEY", raising=False)
            if isinstance(client, Over):
                c: Any = Over(AsyncBerth(berth_url, api_key=api_key), client._loop)
            else:
                c = Berth(berth_url, api_key=api_key)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
