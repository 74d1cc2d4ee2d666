"""E2B's own Python SDK (e2b, sync API), unchanged, against berth.

Each test is something E2B's documentation shows users doing; the SDK
talks to berth's daemon through E2B_API_URL and E2B_SANDBOX_URL only.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
)
from e2b.exceptions import SandboxException, TimeoutException


@pytest.fixture
def sbx(berth_url: str):
    s = Sandbox.create(metadata={"suite": "sync"}, envs={"GREETING": "hello from e2b"}, timeout=300)
    yield s
    s.kill()


def test_create_with_metadata_and_env(sbx: Sandbox) -> None:
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.metadata == {"suite": "sync"}
    assert info.state == SandboxState.RUNNING
    r = sbx.commands.run("echo $GREETING; id -un; pwd")
    assert r.stdout.splitlines() == ["hello from e2b", "user", "/home/user"]
    assert r.exit_code == 0


def test_run_foreground_streaming_and_exit_codes(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    r = sbx.commands.run("for i in 1 2 3; do echo out$i; echo err$i >&2; done", on_stdout=out.append, on_stderr=err.append)
    assert r.stdout == "out1\nout2\nout3\n" and r.stderr == "err1\nerr2\nerr3\n"
    assert "".join(out) == r.stdout and "".join(err) == r.stderr
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo oops >&2; exit 3")
    assert e.value.exit_code == 3 and e.value.stderr == "oops\n"
    r = sbx.commands.run("echo $X; pwd", envs={"X": "per-command"}, cwd="/tmp", user="root")
    assert r.stdout == "per-command\n/tmp\n"
    sbx.files.make_dir("sub")
    assert sbx.commands.run("pwd", cwd="sub").stdout == "/home/user/sub\n"
    assert sbx.commands.run("pwd", cwd="~", user="root").stdout == "/root\n"


def test_run_timeout_kills_the_command(sbx: Sandbox) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - start < 20
    # envd's clock for the timeout started a moment after the client's.
    deadline = time.monotonic() + 5
    while [p for p in sbx.commands.list() if p.args[-1:] == ["sleep 30"]]:
        assert time.monotonic() < deadline, "the timed-out command still runs"
        time.sleep(0.1)


def test_background_stdin_list_connect_kill(sbx: Sandbox) -> None:
    h = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hi there\n")
    assert h.wait().stdout == "got:hi there\n"

    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "through cat\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "through cat\n"

    h = sbx.commands.run("echo started; sleep 600", background=True)
    procs = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in procs and procs[h.pid].args == ["-l", "-c", "echo started; sleep 600"]
    h.disconnect()
    again = sbx.commands.connect(h.pid)
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        again.wait()
    assert h.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(999999) is False


def test_pty(sbx: Sandbox) -> None:
    data = bytearray()
    t = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(t.pid, b"stty size; echo marker-$((6*7)); touch /tmp/answered\n")
    # Resize once the shell has answered at the first size.
    deadline = time.monotonic() + 10
    while not sbx.files.exists("/tmp/answered") and time.monotonic() < deadline:
        time.sleep(0.05)
    sbx.pty.resize(t.pid, PtySize(rows=50, cols=132))
    sbx.pty.send_stdin(t.pid, b"stty size; exit\n")
    t.wait(on_pty=lambda b: data.extend(b))
    text = data.decode(errors="replace")
    assert "24 80" in text and "marker-42" in text and "50 132" in text

    t = sbx.pty.create(PtySize(rows=10, cols=40))
    assert sbx.pty.kill(t.pid) is True


def test_files(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/dir/hello.txt", "hello world")
    assert info.path == "/home/user/dir/hello.txt"
    assert sbx.files.read("dir/hello.txt") == "hello world"
    assert sbx.files.read("/home/user/dir/hello.txt", format="bytes") == b"hello world"
    assert sbx.files.exists("/home/user/dir/hello.txt")
    assert not sbx.files.exists("/home/user/nope")
    names = {e.name for e in sbx.files.list("/home/user/dir")}
    assert names == {"hello.txt"}
    assert sbx.files.make_dir("/home/user/dir/sub") is True
    assert sbx.files.make_dir("/home/user/dir/sub") is False
    moved = sbx.files.rename("/home/user/dir/hello.txt", "/home/user/dir/sub/moved.txt")
    assert moved.path == "/home/user/dir/sub/moved.txt"
    assert [e.name for e in sbx.files.list("/home/user/dir", depth=2) if e.type.value == "file"] == ["moved.txt"]
    sbx.files.remove("/home/user/dir")
    assert not sbx.files.exists("/home/user/dir")
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/dir/sub/moved.txt")
    sbx.files.write("/root/secret.txt", "root only", user="root")
    with pytest.raises(SandboxException):
        sbx.files.read("/root/secret.txt")
    assert sbx.files.read("/root/secret.txt", user="root") == "root only"


def test_write_many_and_large_upload(sbx: Sandbox) -> None:
    infos = sbx.files.write_files([
        {"path": "/home/user/many/a.txt", "data": "A"},
        {"path": "/home/user/many/b.txt", "data": b"B"},
    ])
    assert sorted(i.path for i in infos) == ["/home/user/many/a.txt", "/home/user/many/b.txt"]
    blob = os.urandom(64 << 20)
    sbx.files.write("/home/user/big.bin", blob)
    r = sbx.commands.run("sha256sum /home/user/big.bin | cut -d' ' -f1")
    assert r.stdout.strip() == hashlib.sha256(blob).hexdigest()
    assert hashlib.sha256(sbx.files.read("/home/user/big.bin", format="bytes")).hexdigest() == hashlib.sha256(blob).hexdigest()


def test_watch_dir(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched")
    handle = sbx.files.watch_dir("/home/user/watched")
    sbx.files.write("/home/user/watched/new.txt", "x")
    sbx.commands.run("echo more >> /home/user/watched/new.txt")
    events = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(e.type == FilesystemEventType.WRITE for e in events):
        events += handle.get_new_events()
        time.sleep(0.1)
    handle.stop()
    assert any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in events), events
    assert any(e.name == "new.txt" and e.type == FilesystemEventType.WRITE for e in events), events


def test_get_host_reaches_a_server_inside(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/site/index.html", "served from inside")
    sbx.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
    host = sbx.get_host(8000)
    assert host.startswith(f"8000-{sbx.sandbox_id}.")
    # *.localhost names resolve to loopback in browsers and curl, not in
    # Python's resolver: connect to the daemon and send the Host header.
    port = int(host.rsplit(":", 1)[1])
    deadline = time.monotonic() + 15
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/index.html", headers={"Host": host})
            resp = conn.getresponse()
            body = resp.read().decode()
            if resp.status == 200:
                break
        except OSError:
            body = ""
        finally:
            conn.close()
        if time.monotonic() > deadline:
            pytest.fail(f"no answer from {host}: {body}")
        time.sleep(0.2)
    assert body == "served from inside"


def _get(port: int, host: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/index.html", headers={"Host": host, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_private_traffic_needs_the_traffic_token(berth_url: str) -> None:
    s = Sandbox.create(network={"allow_public_traffic": False}, timeout=120)
    try:
        s.files.write("/home/user/site/index.html", "private")
        s.commands.run("cd /home/user/site && python3 -m http.server 8001", background=True)
        host = s.get_host(8001)
        port = int(host.rsplit(":", 1)[1])
        token = {"e2b-traffic-access-token": s.traffic_access_token}
        deadline = time.monotonic() + 15
        while _get(port, host, token)[0] != 200:
            assert time.monotonic() < deadline, "the server inside did not answer"
            time.sleep(0.2)
        assert _get(port, host, token) == (200, "private")
        assert _get(port, host)[0] == 401
        assert _get(port, host, {"e2b-traffic-access-token": "wrong"})[0] == 401
    finally:
        s.kill()


def test_set_timeout_list_and_kill(berth_url: str) -> None:
    s = Sandbox.create(metadata={"suite": "list", "who": "tester"}, timeout=60)
    other = Sandbox.create(metadata={"suite": "list", "who": "someone-else"}, timeout=60)
    try:
        end = s.get_info().end_at
        s.set_timeout(3600)
        assert (s.get_info().end_at - end).total_seconds() > 3000
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": "list", "who": "tester"})).next_items()
        assert [i.sandbox_id for i in found] == [s.sandbox_id]
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": "list"}, state=[SandboxState.RUNNING])).next_items()
        assert {i.sandbox_id for i in running} == {s.sandbox_id, other.sandbox_id}
    finally:
        other.kill()
    assert s.kill() is True
    assert Sandbox.kill(s.sandbox_id) is False
    assert not Sandbox.list(query=SandboxQuery(metadata={"suite": "list"})).next_items()


def test_pause_and_connect_resumes(berth_url: str) -> None:
    s = Sandbox.create(timeout=120)
    try:
        h = s.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done", background=True)
        time.sleep(0.5)
        s.pause()
        assert Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED
        resumed = Sandbox.connect(s.sandbox_id)
        assert resumed.get_info().state == SandboxState.RUNNING
        a = int(resumed.files.read("/tmp/count"))
        time.sleep(0.5)
        assert int(resumed.files.read("/tmp/count")) > a
        assert h.pid in {p.pid for p in resumed.commands.list()}
    finally:
        s.kill()


def test_connect_after_the_client_process_exits(berth_url: str) -> None:
    script = textwrap.dedent("""
        from e2b import Sandbox
        s = Sandbox.create(metadata={"suite": "reconnect"}, timeout=120)
        s.files.write("/home/user/left.txt", "left behind")
        s.commands.run("sleep 600", background=True)
        print(s.sandbox_id)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    sid = out.stdout.strip()
    s = Sandbox.connect(sid)
    try:
        assert s.files.read("/home/user/left.txt") == "left behind"
        assert any(p.args[-1:] == ["sleep 600"] for p in s.commands.list())
    finally:
        s.kill()


def test_snapshot_and_fork(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/state.txt", "before")
    snap = sbx.create_snapshot(name="sync-snap")
    assert snap.snapshot_id == "snapshot:sync-snap" and snap.names == [snap.snapshot_id]
    try:
        listed = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
        assert [x.snapshot_id for x in listed] == [snap.snapshot_id]
        assert [x.snapshot_id for x in Sandbox.list_snapshots(name="sync-snap:default").next_items()] == [snap.snapshot_id]
        made = Sandbox.create(snap.snapshot_id, timeout=60)
        try:
            assert made.files.read("/home/user/state.txt") == "before"
            assert made.get_info().template_id == snap.snapshot_id
        finally:
            made.kill()
    finally:
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False

    forks = sbx.fork(count=2, timeout=60)
    try:
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks)
        for f in forks:
            assert f.files.read("/home/user/state.txt") == "before"
            info = f.get_info()
            assert info.state == SandboxState.RUNNING and (info.end_at - info.started_at).total_seconds() == 60
        forks[0].files.write("/home/user/state.txt", "in a fork")
        assert sbx.files.read("/home/user/state.txt") == "before"
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()


def test_metrics(sbx: Sandbox) -> None:
    sbx.commands.run("head -c 20000000 /dev/zero > /tmp/fill")
    metrics = sbx.get_metrics()
    assert metrics and metrics[-1].mem_used > 0 and metrics[-1].disk_used >= 20000000
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    assert sbx.get_metrics(start=hour_ago, end=hour_ago + timedelta(minutes=30)) == []


def test_filesystem_only_pause_is_a_stop(berth_url: str) -> None:
    s = Sandbox.create(timeout=120)
    try:
        s.files.write("/home/user/kept.txt", "kept")
        s.commands.run("sleep 600", background=True)
        assert s.pause(keep_memory=False)
        assert not s.is_running()
        again = Sandbox.connect(s.sandbox_id)
        assert again.files.read("/home/user/kept.txt") == "kept"
        assert not [p for p in again.commands.list() if p.args[-1:] == ["sleep 600"]]
    finally:
        s.kill()


def test_errors_the_sdk_expects(berth_url: str) -> None:
    with pytest.raises(SandboxException):
        Sandbox.create(template="no-such-template")
    with pytest.raises(NotFoundException):
        Sandbox.connect("sb-doesnotexist0")


def test_shortened_timeout_ends_the_sandbox_on_time(berth_url: str) -> None:
    s = Sandbox.create(timeout=300)
    s.set_timeout(2)
    time.sleep(3)
    assert s.is_running() is False
    with pytest.raises(SandboxException):
        s.commands.run("true")


def _berth_key(berth_url: str, admin_key: str, tenant: str) -> str:
    """A write key for tenant, made through berth's own API (POST /v1/keys)
    with the admin key: E2B's API has no call that makes keys."""
    req = urllib.request.Request(  # noqa: S310
        berth_url + "/v1/keys",
        data=json.dumps({"tenant": tenant, "name": f"e2b-test-{os.getpid()}"}).encode(),
        headers={"Authorization": "Bearer " + admin_key, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
        return json.loads(r.read())["key"]


def test_a_wrong_key_is_e2bs_authentication_exception(berth_url: str) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(timeout=60, api_key="e2b_0123456789abcdef0123456789abcdef01234567")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="berth_" + "0" * 12 + "_" + "0" * 64).next_items()


def test_a_tenants_key_sees_its_own_sandboxes(berth_url: str, admin_key: str) -> None:
    # A tenant's key (as E2B_API_KEY, or api_key=) sees its own sandboxes only.
    tenant_key = _berth_key(berth_url, admin_key, "t-e2b")
    mine = Sandbox.create(metadata={"suite": "keys"}, timeout=60, api_key=tenant_key)
    theirs = Sandbox.create(metadata={"suite": "keys"}, timeout=60)
    try:
        assert mine.commands.run("echo mine").stdout == "mine\n"
        query = SandboxQuery(metadata={"suite": "keys"})
        assert [i.sandbox_id for i in Sandbox.list(query=query, api_key=tenant_key).next_items()] == [mine.sandbox_id]
        assert {i.sandbox_id for i in Sandbox.list(query=query).next_items()} == {mine.sandbox_id, theirs.sandbox_id}
        with pytest.raises(NotFoundException):
            Sandbox.get_info(theirs.sandbox_id, api_key=tenant_key)
        assert Sandbox.kill(theirs.sandbox_id, api_key=tenant_key) is False
        assert theirs.is_running()
    finally:
        theirs.kill()
        mine.kill()
