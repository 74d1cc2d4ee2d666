"""The SDK against a live daemon: lifecycle, exec, files, errors."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from berth import (
    AsyncBerth,
    AsyncSandbox,
    Berth,
    Conflict,
    DaemonUnreachable,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SandboxInfo,
)
from berth.deepagents import BerthSandbox


def test_lifecycle_and_context_manager(client: Berth) -> None:
    with client.create(labels={"suite": "sdk"}, memory=256 << 20) as sb:
        assert sb.info.state == "running"
        assert any(s.id == sb.id for s in client.list({"suite": "sdk"}))
        sb.stop()
        with pytest.raises(Conflict) as exc:
            sb.exec("true")
        assert "stopped" in exc.value.message
        sb.start()
        assert sb.exec("echo $HOSTNAME").stdout.strip() == sb.id
    with pytest.raises(NotFound) as exc:
        client.get(sb.id)
    assert sb.id in exc.value.message


def test_runtimes_and_a_refused_runtime(client: Berth) -> None:
    rts = {r["name"]: r for r in client.runtimes()}
    default = os.environ.get("BERTH_TEST_RUNTIME", "native")
    assert rts[default]["default"] and sum(r["default"] for r in rts.values()) == 1
    for name in ("native", "gvisor"):
        assert rts[name]["available"], rts[name].get("reason")
        assert "memory_bytes" in rts[name]["capabilities"]["limits"]
        assert rts[name]["capabilities"]["max"]["cpus"] >= 1
        with client.create(runtime=name) as sb:
            assert sb.info.raw["runtime"] == name
            assert sb.exec("echo hi").stdout == "hi\n"
    with pytest.raises(InvalidArgument) as exc:
        client.create(runtime="no-such-runtime")
    assert "no-such-runtime" in exc.value.message


def test_get_or_create_is_one_per_conversation(client: Berth) -> None:
    a = client.get_or_create({"thread_id": "sdk-conv-1"})
    b = client.get_or_create({"thread_id": "sdk-conv-1"})
    try:
        assert a.id == b.id
    finally:
        a.delete()


def test_exec_results(client: Berth) -> None:
    with client.create() as sb:
        r = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], env={"X": "1"})
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        r = sb.exec("cat", stdin=b"piped")
        assert r.stdout == "piped"
        r = sb.exec("sleep 10", timeout=0.5)
        assert r.timed_out and r.signal == 9
        events = list(sb.exec_stream("for i in 1 2 3; do echo $i; done; exit 4"))
        assert events[0].type == "start"
        assert b"".join(e.data for e in events if e.type == "stdout") == b"1\n2\n3\n"
        assert events[-1].type == "exit" and events[-1].result is not None and events[-1].result.exit_code == 4
        pid = sb.start_process("sleep 30")
        sb.kill_process(pid)
        assert sb.wait_process(pid, timeout=10).signal == 9


def test_oom_killed(client: Berth) -> None:
    with client.create(memory=64 << 20) as sb:
        r = sb.exec(["python3", "-c", "b = bytearray(1 << 30)"])
        assert r.oom_killed and r.exit_code == 137


def test_files_round_trip_10mib(client: Berth, tmp_path) -> None:  # noqa: ANN001
    data = os.urandom(10 << 20)
    with client.create() as sb:
        fi = sb.upload("/home/user/big.bin", data)
        assert fi["size"] == len(data) and fi["owner"] == "user"
        assert hashlib.sha256(sb.download("/home/user/big.bin")).digest() == hashlib.sha256(data).digest()
        local = tmp_path / "copy.bin"
        sb.download_to("/home/user/big.bin", local)
        assert local.read_bytes() == data
        inside = sb.exec("sha256sum /home/user/big.bin").stdout.split()[0]
        assert inside == hashlib.sha256(data).hexdigest()


def test_file_tools_and_errors(client: Berth) -> None:
    with client.create() as sb:
        sb.write("/home/user/p/a.py", "x = 1\ny = 2\n")
        assert sb.edit("/home/user/p/a.py", "x = 1", "x = 10") == 1
        page = sb.read("/home/user/p/a.py")
        assert [ln["text"] for ln in page["lines"]] == ["x = 10", "y = 2"] and page["total_lines"] == 2
        assert [m["line"] for m in sb.grep("y =", "/home/user")["matches"]] == [2]
        assert [m["path"] for m in sb.glob("**/*.py", "/home/user")["matches"]] == ["/home/user/p/a.py"]
        with pytest.raises(NotFound) as nf:
            sb.download("/nope")
        assert "/nope" in nf.value.message
        with pytest.raises(InvalidArgument) as isdir:
            sb.download("/home")
        assert isdir.value.reason == "is_directory"
        with pytest.raises(PermissionDenied):
            sb.write("/etc/x", "no")
        res = sb.download_files(["/home/user/p/a.py", "/nope"])
        assert res[0]["content"].startswith(b"x = 10") and res[1]["error"]["class"] == "not_found"


def test_deepagents_errors_and_timeout(sync_client: Berth) -> None:
    with sync_client.create() as sb:
        backend = BerthSandbox(sandbox=sb)
        timed = backend.execute("sleep 5", timeout=1)
        assert timed.exit_code == 124 and "timed out after 1 seconds" in timed.output
        ups = backend.upload_files([("/home/user/ok.txt", b"ok"), ("/etc/no.txt", b"no"), ("rel.txt", b"x")])
        assert [u.error for u in ups] == [None, "permission_denied", "invalid_path"]
        downs = backend.download_files(["/home/user/ok.txt", "/home/user/missing", "/home", "rel"])
        assert [d.error for d in downs] == [None, "file_not_found", "is_directory", "invalid_path"]
        assert downs[0].content == b"ok"


def test_daemon_down_names_the_url() -> None:
    with Berth("http://127.0.0.1:9", timeout=2) as c, pytest.raises(DaemonUnreachable) as exc:
        c.list()
    assert "http://127.0.0.1:9" in str(exc.value)


def test_async_client(berth_url: str) -> None:
    async def run() -> None:
        async with AsyncBerth(berth_url) as c:
            sb = await c.create()
            async with sb:
                r = await sb.exec("echo async")
                assert r.stdout == "async\n"
                await sb.upload("/home/user/a.txt", "hi")
                assert await sb.download("/home/user/a.txt") == b"hi"
                chunks = [e.data async for e in sb.exec_stream(["printf", "abc"]) if e.type == "stdout"]
                assert b"".join(chunks) == b"abc"
            with pytest.raises(NotFound):
                await c.get(sb.id)

    asyncio.run(run())


def test_async_client_streams_uploads_and_downloads(berth_url: str, tmp_path: Path) -> None:
    """What only the async client takes: uploads from an async iterator, from
    a binary file and from a plain iterator (read in a thread), a download as
    an async iterator, and a tar in and out; a daemon that is down names its
    URL on a streamed call too."""

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for i in range(n):
            yield bytes([i]) * 65536

    async def run() -> None:
        async with AsyncBerth(berth_url) as c, await c.create() as sb:
            await sb.upload("/home/user/big.bin", chunks(64))  # 4 MiB, streamed
            want = b"".join(bytes([i]) * 65536 for i in range(64))
            got = b"".join([part async for part in sb.download_stream("/home/user/big.bin", chunk_size=1 << 16)])
            assert got == want
            (tmp_path / "local.txt").write_bytes(b"from a file\n")
            with open(tmp_path / "local.txt", "rb") as f:
                await sb.upload("/home/user/from-file.txt", f)
            await sb.upload("/home/user/from-iter.txt", iter([b"one ", b"", b"two\n"]))
            assert await sb.download("/home/user/from-iter.txt") == b"one two\n"
            await sb.download_to("/home/user/from-file.txt", tmp_path / "back.txt")
            assert (tmp_path / "back.txt").read_bytes() == b"from a file\n"
            tar = await sb.download_archive("/home/user/from-file.txt")
            await sb.upload_archive("/home/user/unpacked", tar)
            assert await sb.read("/home/user/unpacked/from-file.txt") is not None
            assert await sb.exists("/home/user/unpacked/from-file.txt")
        async with AsyncBerth("http://127.0.0.1:9", timeout=2) as down:
            sb = AsyncSandbox(down, SandboxInfo(id="sb-x", state="running"))
            with pytest.raises(DaemonUnreachable, match="127.0.0.1:9"):
                [e async for e in sb.exec_stream("true")]

    asyncio.run(run())


def test_every_error_class_of_the_api_has_its_exception() -> None:
    """Each class in api/openapi.yaml's Error enum becomes the exception of
    that class, with the daemon's message and reason kept verbatim."""
    from berth.errors import error_for

    doc = (Path(__file__).resolve().parents[3] / "api" / "openapi.yaml").read_text()
    block = doc[doc.index("\n    Error:\n") :]
    block = block[block.index("enum:") : block.index("message:")]
    classes = [ln.strip()[2:] for ln in block.splitlines() if ln.strip().startswith("- ")]
    assert len(classes) >= 13, classes
    for cls in classes:
        e = error_for(400, {"error": {"class": cls, "message": f"the daemon's words for {cls}", "reason": "sandbox_gone"}})
        assert e.error_class == cls and e.message == f"the daemon's words for {cls}" and e.reason == "sandbox_gone"
        assert str(e) == e.message


def test_async_client_has_every_method_of_the_sync_one() -> None:
    """The async classes have each public method of the sync ones (close is
    aclose), so nothing a sync user can do is missing when they go async."""
    import inspect

    from berth import AsyncTerminal, Sandbox, Terminal

    for sync, asyn, renamed in ((Sandbox, AsyncSandbox, {}), (Berth, AsyncBerth, {"close": "aclose"}), (Terminal, AsyncTerminal, {})):
        names = {n for n, _ in inspect.getmembers(sync) if not n.startswith("_")}
        missing = sorted(n for n in names if not hasattr(asyn, renamed.get(n, n)))
        assert not missing, f"{asyn.__name__} lacks {missing}"
