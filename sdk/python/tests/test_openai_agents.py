"""The OpenAI Agents SDK sandbox client (berth.openai_agents) against the
session's real daemon: SandboxAgents driven by the SDK's own ScriptedModel
through Runner.run, and the session interface directly (state that resumes
in a new client, workspace tars, exec timeouts, ports, PTYs, errors)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import resource
import tarfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pydantic
import pytest
from agents import Runner, function_tool
from agents.items import ToolCallOutputItem
from agents.run import RunConfig
from agents.run_state import RunState
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.manifest import Environment
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    PtySessionNotFoundError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.session import SandboxSession
from agents.sandbox.snapshot import LocalSnapshotSpec, NoopSnapshot
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall

from berth import Berth, Conflict, DaemonUnreachable, InvalidArgument, NotFound
from berth.openai_agents import (
    SESSION_LABEL,
    BerthSandboxClient,
    BerthSandboxClientOptions,
    BerthSandboxSession,
    BerthSandboxSessionState,
)

REPO = Path(__file__).resolve().parents[3]


def _ours(client: Berth) -> set[str]:
    return {s.id for s in client.list() if SESSION_LABEL in s.labels}


@pytest.fixture(scope="module")
def bc(berth_url: str) -> Iterator[Berth]:
    """A sync client to look at the daemon from outside the Agents SDK."""
    with Berth(berth_url) as c:
        yield c


@pytest.fixture(autouse=True)
def no_leftovers(bc: Berth) -> Iterator[None]:
    """Each test releases every sandbox it made (on_exit="delete" or by hand)."""
    before = _ours(bc)
    yield
    left = _ours(bc) - before
    for id in left:
        bc.delete(id)
    assert not left, f"sandboxes left behind: {sorted(left)}"


@pytest.fixture
async def sbx(berth_url: str) -> AsyncIterator[BerthSandboxClient]:
    async with BerthSandboxClient(berth_url) as c:
        yield c


def _inner(session: SandboxSession) -> BerthSandboxSession:
    inner = session._inner
    assert isinstance(inner, BerthSandboxSession)
    return inner


async def _text(session: SandboxSession, path: str) -> str:
    return (await session.read(Path(path))).read().decode()


def _patch_call(call_id: str, patch: str) -> ResponseCustomToolCall:
    return ResponseCustomToolCall(type="custom_tool_call", call_id=call_id, id=call_id, name="apply_patch", input=patch)


def _outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


def _sandbox_config(client: BerthSandboxClient, tmp_path: Path, **options: Any) -> RunConfig:
    return RunConfig(
        sandbox=SandboxRunConfig(
            client=client,
            options=BerthSandboxClientOptions(**options),
            # The runner's default snapshot lives in the home directory; the test's in tmp_path.
            snapshot=LocalSnapshotSpec(base_path=tmp_path),
        ),
        tracing_disabled=True,
    )


PLAN_PATCH = "*** Begin Patch\n*** Add File: notes/plan.md\n+step one\n+step two\n*** End Patch\n"


async def test_agent_runs_a_command_writes_and_reads_a_file(sbx: BerthSandboxClient, bc: Berth, tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "echo kernel=$(uname -s) in $(pwd) as $(id -un)"}, call_id="c1")],
            [_patch_call("c2", PLAN_PATCH)],
            [function_call("exec_command", {"cmd": "cat /workspace/notes/plan.md"}, call_id="c3")],
            [assistant_message("The plan has two steps.")],
        ]
    )
    agent = SandboxAgent(name="planner", model=model, instructions="Work in the sandbox.")
    result = await Runner.run(agent, "Write a two-step plan.", run_config=_sandbox_config(sbx, tmp_path))
    model.assert_complete()
    assert result.final_output == "The plan has two steps."
    ran, patched, read = _outputs(result)
    assert "kernel=Linux in /workspace as user" in ran
    assert "notes/plan.md" in patched
    assert read.endswith("Output:\nstep one\nstep two")
    # The model saw the command's output in its next turn.
    assert "step one" in json.dumps(model.last_call.input if model.last_call else "", default=str)
    # The runner persisted the workspace to the snapshot, then the sandbox was deleted (on_exit).
    state = result.to_state()
    assert state._sandbox is not None and state._sandbox["backend_id"] == "berth"
    sandbox_id = state._sandbox["session_state"]["sandbox_id"]
    with pytest.raises(NotFound):
        bc.get(sandbox_id)
    (snap,) = tmp_path.glob("*.tar")
    with tarfile.open(snap) as tf:
        plan = tf.extractfile("notes/plan.md")
        assert plan is not None and plan.read().rstrip(b"\n") == b"step one\nstep two"


async def test_run_state_resumes_the_same_sandbox_in_a_new_client(berth_url: str, bc: Berth, tmp_path: Path) -> None:
    @function_tool(needs_approval=True)
    def publish() -> str:
        """Publish the result."""
        return "published"

    first = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "printf v1 > state.txt && echo outside > ~/outside.txt && echo saved"}, call_id="c1")],
            [function_call("publish", {}, call_id="c2")],
        ]
    )
    agent = SandboxAgent(name="worker", model=first, instructions="Work.", tools=[publish])
    async with BerthSandboxClient(berth_url) as sbx:
        result = await Runner.run(agent, "save and publish", run_config=_sandbox_config(sbx, tmp_path, on_exit="stop"))
    (saved_output,) = _outputs(result)
    assert saved_output.endswith("Output:\nsaved\n")
    assert len(result.interruptions) == 1
    saved = result.to_state().to_json()
    sandbox_id = saved["sandbox"]["session_state"]["sandbox_id"]
    assert saved["sandbox"]["session_state"]["type"] == "berth"
    assert bc.get(sandbox_id).info.state == "stopped"  # on_exit="stop": files kept, nothing runs

    # A new process: a new client, the state from JSON.
    second = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "cat state.txt ~/outside.txt"}, call_id="c3")],
            [assistant_message("resumed")],
        ]
    )
    agent2 = SandboxAgent(name="worker", model=second, instructions="Work.", tools=[publish])
    restored = await RunState.from_json(agent2, json.loads(json.dumps(saved)))
    restored.approve(restored.get_interruptions()[0])
    async with BerthSandboxClient(berth_url) as sbx2:
        result2 = await Runner.run(agent2, restored, run_config=_sandbox_config(sbx2, tmp_path, on_exit="stop"))
    assert result2.final_output == "resumed"
    assert "published" in _outputs(result2)
    # The workspace file, and one outside the workspace (no snapshot has it): the same sandbox.
    assert _outputs(result2)[-1].endswith("Output:\nv1outside\n")
    state2 = result2.to_state()._sandbox
    assert state2 is not None and state2["session_state"]["sandbox_id"] == sandbox_id
    assert bc.get(sandbox_id).info.state == "stopped"
    bc.delete(sandbox_id)


@pytest.mark.parametrize("on_exit", ["delete", "stop", "pause", "keep"])
async def test_session_state_resumes_in_a_new_client(
    berth_url: str, bc: Berth, tmp_path: Path, on_exit: str
) -> None:
    async with BerthSandboxClient(berth_url) as sbx:
        session = await sbx.create(
            snapshot=LocalSnapshotSpec(base_path=tmp_path), options=BerthSandboxClientOptions(on_exit=on_exit, labels={"t": on_exit})
        )
        first_id = _inner(session).sandbox_id
        await session.start()
        await session.write(Path("memo.txt"), io.BytesIO(b"remember"))
        await session.aclose()  # persists the workspace to the snapshot, then on_exit
        payload = json.loads(json.dumps(sbx.serialize_session_state(session.state)))
    assert payload["sandbox_id"] == first_id and payload["options"]["on_exit"] == on_exit
    assert "api_key" not in json.dumps(payload)
    if on_exit == "delete":
        with pytest.raises(NotFound):
            bc.get(first_id)
    else:
        assert bc.get(first_id).info.state == {"stop": "stopped", "pause": "paused", "keep": "running"}[on_exit]

    async with BerthSandboxClient(berth_url) as sbx2:
        state = sbx2.deserialize_session_state(payload)
        assert isinstance(state, BerthSandboxSessionState) and state.options.labels == {"t": on_exit}
        resumed = await sbx2.resume(state)
        async with resumed:
            assert await _text(resumed, "memo.txt") == "remember"
            same = _inner(resumed).sandbox_id == first_id
            # Only a deleted sandbox is replaced (its workspace restored from the snapshot).
            assert same == (on_exit != "delete")
            info = bc.get(_inner(resumed).sandbox_id).info
            assert info.state == "running" and info.labels["t"] == on_exit
        await sbx2.delete(resumed)
    if on_exit != "delete":
        if on_exit == "pause":
            # Thawed first: deleting a paused gvisor sandbox hangs in runsc delete (a daemon bug, reported).
            bc.get(first_id).resume()
        bc.delete(first_id)


async def test_persist_and_hydrate_the_workspace_as_a_tar(sbx: BerthSandboxClient, bc: Berth) -> None:
    src = await sbx.create()
    dst = await sbx.create()
    async with src, dst:
        await src.write(Path("a.txt"), io.BytesIO(b"alpha"))
        await src.write(Path("sub/b.txt"), io.BytesIO(b"beta"))
        await src.write(Path("cache/big.bin"), io.BytesIO(b"\0" * 4096))
        res = await src.exec("ln -s sub/b.txt rel_link && ln -s /workspace/a.txt abs_link && chmod 755 sub/b.txt")
        assert res.ok(), res.stderr
        assert await src.read_bounded(Path("a.txt"), max_bytes=3) == b"alp"
        assert await src.read_bounded(Path("sub/b.txt"), max_bytes=100) == b"beta"
        src.register_persist_workspace_skip_path("cache")
        tar = await src.persist_workspace()
        raw = tar.read()
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            names = sorted(tf.getnames())
            links = {m.name: m.linkname for m in tf.getmembers() if m.issym()}
        assert names == [".", "a.txt", "abs_link", "rel_link", "sub", "sub/b.txt"]
        # An absolute link inside the workspace is made relative, so it means the same anywhere.
        assert links == {"abs_link": "a.txt", "rel_link": "sub/b.txt"}

        await dst.hydrate_workspace(io.BytesIO(raw))
        out = await dst.exec("cat a.txt sub/b.txt abs_link rel_link; echo; stat -c '%U %a' sub/b.txt; ls cache 2>&1 || true")
        lines = out.stdout.decode().splitlines()
        assert lines[0] == "alphabetaalphabeta"
        assert lines[1] == "user 755"
        assert "No such file" in lines[2]

        # A tar that would leave the workspace is refused before it reaches the sandbox.
        evil = io.BytesIO()
        with tarfile.open(fileobj=evil, mode="w") as tf:
            info = tarfile.TarInfo("../escape.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(WorkspaceArchiveWriteError) as ei:
            await dst.hydrate_workspace(io.BytesIO(evil.getvalue()))
        assert ei.value.context["reason"] == "unsafe_or_invalid_tar"
        assert not (await dst.exec("test -e /escape.txt")).ok()


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def test_persist_streams_the_workspace_under_a_byte_cap(sbx: BerthSandboxClient) -> None:
    # A sparse file's holes come in the archive in full: 2 GiB from a truncate. The archive is
    # streamed to a spooled file (never held in memory) and refused past the cap (1 GiB default).
    async with await sbx.create() as session:
        assert (await session.exec("truncate -s 2G /workspace/sparse && echo small > /workspace/a.txt")).ok()
        before = _peak_rss_mib()
        with pytest.raises(WorkspaceArchiveReadError) as ei:
            await session.persist_workspace()
        grew = _peak_rss_mib() - before
        assert grew < 256, f"persisting a 2 GiB sparse file grew the peak RSS by {grew:.0f} MiB"
        assert ei.value.context["reason"] == "workspace_archive_too_large"
        assert ei.value.context["max_bytes"] == 1 << 30
        assert "max_workspace_archive_bytes" in str(ei.value) and "1073741824 bytes" in str(ei.value)
        # Without it the workspace persists as usual.
        assert (await session.exec("rm /workspace/sparse")).ok()
        with tarfile.open(fileobj=await session.persist_workspace()) as tf:
            assert sorted(tf.getnames()) == [".", "a.txt"]

    # A cap of its own, in the options (and a bad one is refused where it is made).
    with pytest.raises(pydantic.ValidationError, match="max_workspace_archive_bytes"):
        BerthSandboxClientOptions(max_workspace_archive_bytes=0)
    async with await sbx.create(options=BerthSandboxClientOptions(max_workspace_archive_bytes=1 << 20)) as session:
        assert (await session.exec("head -c 2000000 /dev/urandom > /workspace/big.bin")).ok()
        with pytest.raises(WorkspaceArchiveReadError, match="1048576 bytes"):
            await session.persist_workspace()


async def test_read_streams_a_file_under_a_byte_cap(sbx: BerthSandboxClient) -> None:
    # read() is the sandbox's file whole: spooled (not held in memory) and refused past
    # max_read_bytes, since a sparse file of any size costs the sandbox nothing.
    async with await sbx.create(options=BerthSandboxClientOptions(max_read_bytes=1 << 20)) as session:
        assert (await session.exec("truncate -s 2G /workspace/sparse && printf hi > /workspace/small")).ok()
        before = _peak_rss_mib()
        with pytest.raises(WorkspaceArchiveReadError) as ei:
            await session.read("/workspace/sparse")
        assert _peak_rss_mib() - before < 64
        assert ei.value.context["reason"] == "file_too_large" and "max_read_bytes" in str(ei.value)
        assert (await session.read("/workspace/small")).read() == b"hi"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read("/workspace/missing")


async def test_exec_timeout_kills_the_command(sbx: BerthSandboxClient) -> None:
    async with await sbx.create() as session:
        t0 = time.monotonic()
        with pytest.raises(ExecTimeoutError) as ei:
            await session.exec("sleep 30 & sleep 30; echo never", timeout=1)
        assert time.monotonic() - t0 < 15
        assert ei.value.timeout_s == 1
        # The whole process group went, the background sleep too.
        ps = await session.exec("ps -eo comm | grep -c '^sleep$' || true")
        assert ps.stdout.decode().strip() == "0"
        # The next command runs as usual; exit codes and stderr come back.
        res = await session.exec("echo out; echo err >&2; exit 7")
        assert (res.exit_code, res.stdout, res.stderr) == (7, b"out\n", b"err\n")
        # Output past berth's bound (4 MiB a stream) is cut, and stderr says so.
        big = await session.exec("head -c 5000000 /dev/zero | tr '\\0' a")
        assert big.ok() and len(big.stdout) == 4 << 20 and big.stdout[:3] == b"aaa"
        assert big.stderr == b"\n[berth: stdout was cut at the sandbox's output limit]\n"
        # Another user, without sudo in the sandbox.
        assert (await session.exec("id -un", user="root")).stdout == b"root\n"


async def test_a_sandbox_stopped_or_paused_meanwhile_comes_back(sbx: BerthSandboxClient, bc: Berth) -> None:
    # Its idle timeout (or anyone) stopped it between two tool calls: the next call starts it.
    async with await sbx.create() as session:
        await session.write(Path("kept.txt"), io.BytesIO(b"kept"))
        outside = bc.get(_inner(session).sandbox_id)
        outside.stop()
        assert (await session.exec("cat kept.txt")).stdout == b"kept"
        assert outside.refresh().state == "running"
        outside.pause()
        assert await _text(session, "kept.txt") == "kept"
        assert outside.refresh().state == "running"
        outside.stop()
        update = await session.pty_exec_start("cat kept.txt", yield_time_s=2)
        assert update.output == b"kept" and update.exit_code == 0


async def test_a_command_stopped_mid_run_is_not_run_again(sbx: BerthSandboxClient, bc: Berth) -> None:
    # Stopped by another client while the command ran: the call fails, and the command
    # (it had started) is not run a second time when the sandbox is brought back.
    async with await sbx.create() as session:
        outside = bc.get(_inner(session).sandbox_id)
        run = asyncio.ensure_future(session.exec("echo ran >> /workspace/log; sleep 6; echo done"))
        deadline = time.monotonic() + 10
        while not (await asyncio.to_thread(outside.exec, "test -s /workspace/log")).ok:
            assert time.monotonic() < deadline, "the command did not start"
            await asyncio.sleep(0.1)
        # Stopped with this loop held, so the exec's answer is read once the stop is done.
        outside.stop()
        with pytest.raises(ExecTransportError) as ei:
            await run
        assert ei.value.context["error_class"] == "conflict", ei.value
        # The next call finds it stopped (refused before it ran) and starts it.
        assert (await session.exec("wc -l < /workspace/log")).stdout.strip() == b"1"
        assert outside.refresh().state == "running"


async def test_a_pty_start_that_may_have_run_is_not_marked_retry_safe(
    sbx: BerthSandboxClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A conflict without a reason (the sandbox stopped while the call ran) may come after the
    # process started: neither _call nor the SDK's shell tool (retry_safe) may run it again.
    async with await sbx.create() as session:
        calls = 0

        async def start_process(*args: Any, **kw: Any) -> int:
            nonlocal calls
            calls += 1
            raise Conflict("sandbox sb-x was stopping while the call ran")

        monkeypatch.setattr(_inner(session).sandbox, "start_process", start_process)
        with pytest.raises(ExecTransportError) as ei:
            await session.pty_exec_start("echo once >> log", yield_time_s=1)
        assert calls == 1
        assert ei.value.context.get("retry_safe") is not True
        # Refused before it ran (its reason says so): the shell tool may fall back.
        calls = 0

        async def refused(*args: Any, **kw: Any) -> int:
            nonlocal calls
            calls += 1
            raise InvalidArgument("cwd: no such directory")

        monkeypatch.setattr(_inner(session).sandbox, "start_process", refused)
        with pytest.raises(ExecTransportError) as ei:
            await session.pty_exec_start("echo once >> log", yield_time_s=1)
        assert calls == 1 and ei.value.context["retry_safe"] is True


PLANT = "#!/bin/sh\nid -u > /tmp/planted-ran\nexit 0\n"


async def test_root_setup_does_not_run_programs_the_user_planted_on_path(sbx: BerthSandboxClient) -> None:
    # The manifest's PATH names a directory the sandbox's user writes (a venv in the workspace):
    # the SDK's administrative commands, run as root, must not find the user's chmod there.
    manifest = Manifest(environment=Environment(value={"PATH": "/workspace/bin:/usr/local/bin:/usr/bin:/bin"}))
    async with await sbx.create(manifest=manifest) as session:
        await session.write(Path("bin/chmod"), io.BytesIO(PLANT.encode()))
        await session.write(Path("target"), io.BytesIO(b"x"))
        assert (await session.exec("chmod 755 /workspace/bin/chmod && /bin/chmod 600 target")).ok()
        await _inner(session)._exec_checked_nonzero("chmod", "640", "/workspace/target")
        assert not (await session.exec("test -e /tmp/planted-ran")).ok(), "root ran the user's planted chmod"
        assert (await session.exec("stat -c %a target")).stdout == b"640\n"

    # The same for the sh that makes the workspace root at start, with the options' PATH.
    options = BerthSandboxClientOptions(env={"PATH": "/workspace/bin:/usr/local/bin:/usr/bin:/bin"})
    async with await sbx.create(options=options) as session:
        await session.write(Path("bin/sh"), io.BytesIO(PLANT.encode()))
        assert (await session.exec("/bin/chmod", "755", "/workspace/bin/sh", shell=False)).ok()
        await _inner(session)._make_root()
        res = await session.exec("/bin/cat", "/tmp/planted-ran", shell=False)
        assert res.exit_code != 0, f"root ran the user's planted sh (as uid {res.stdout!r})"


async def test_exposed_port_is_reached_through_the_daemon(sbx: BerthSandboxClient, berth_url: str) -> None:
    port = 8765
    async with await sbx.create(options=BerthSandboxClientOptions(exposed_ports=(port,))) as session:
        await session.write(Path("index.html"), io.BytesIO(b"<h1>from the workspace</h1>"))
        server = await session.pty_exec_start(f"python3 -m http.server {port} --bind 127.0.0.1", yield_time_s=0.25)
        assert server.process_id is not None and server.exit_code is None
        await _inner(session).sandbox.wait_for_port(port, timeout=20)
        endpoint = await session.resolve_exposed_port(port)
        assert endpoint.host == f"{port}-{_inner(session).sandbox_id}.berth.localhost"
        assert endpoint.port == urlsplit(berth_url).port and not endpoint.tls
        url = endpoint.url_for("http")
        assert "berth_access_token=" in url
        # *.localhost need not resolve here: send the endpoint's name as Host to the daemon.
        async with httpx.AsyncClient() as http:
            r = await http.get(f"{berth_url}/?{endpoint.query}", headers={"Host": f"{endpoint.host}:{endpoint.port}"})
            assert r.status_code == 200 and r.text == "<h1>from the workspace</h1>"
        async with httpx.AsyncClient() as stranger:  # no token (nor the cookie it set), no entry
            r = await stranger.get(f"{berth_url}/", headers={"Host": f"{endpoint.host}:{endpoint.port}"})
            assert r.status_code in (401, 403)
        with pytest.raises(ExposedPortUnavailableError) as ei:
            await session.resolve_exposed_port(9999)
        assert ei.value.context["reason"] == "not_configured"


async def test_pty_write_stdin(sbx: BerthSandboxClient, bc: Berth) -> None:
    # Kept at the end, to see that closing the session ended its processes.
    async with await sbx.create(options=BerthSandboxClientOptions(on_exit="keep")) as session:
        assert session.supports_pty()
        shell = await session.pty_exec_start("sh", shell=False, tty=True, yield_time_s=0.5)
        sid = shell.process_id
        assert sid is not None and shell.exit_code is None
        update = await session.pty_write_stdin(session_id=sid, chars="echo $((6*7)) $(pwd)\n", yield_time_s=1)
        assert "42 /workspace" in update.output.decode()
        assert update.process_id == sid
        done = await session.pty_write_stdin(session_id=sid, chars="exit 5\n", yield_time_s=5)
        assert done.process_id is None and done.exit_code == 5
        with pytest.raises(PtySessionNotFoundError):
            await session.pty_write_stdin(session_id=sid, chars="x")

        # Without a terminal a command reads an empty stdin and cannot be written to.
        cat = await session.pty_exec_start("cat; echo eof-seen; sleep 30", yield_time_s=1)
        assert cat.process_id is not None and b"eof-seen" in cat.output
        with pytest.raises(RuntimeError, match="stdin is not available"):
            await session.pty_write_stdin(session_id=cat.process_id, chars="x")
        running = [p.pid for p in await _inner(session).sandbox.list_processes() if p.running]
        assert running
    # Closing the session killed what still ran.
    sandbox = bc.get(_inner(session).sandbox_id)
    assert sandbox.info.state == "running"
    assert not [p.pid for p in sandbox.list_processes() if p.running]
    sandbox.delete()


async def test_agent_drives_a_terminal_with_write_stdin(sbx: BerthSandboxClient, tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "python3 -q", "tty": True, "yield_time_ms": 1000}, call_id="c1")],
        ]
    )
    captured: dict[str, int] = {}

    def write_to_it(call: Any) -> Any:
        # The session id comes from exec_command's answer.
        out = json.dumps(call.input, default=str)
        sid = int(out.split("Process running with session ID ")[1].split("\\n")[0])
        captured["sid"] = sid
        return [function_call("write_stdin", {"session_id": sid, "chars": "print(6*7)\nexit()\n", "yield_time_ms": 3000},
                              call_id="c2")]

    model.extend([{"responder": write_to_it}, [assistant_message("42")]])
    agent = SandboxAgent(name="repl", model=model, instructions="Use the REPL.")
    result = await Runner.run(agent, "What is 6*7?", run_config=_sandbox_config(sbx, tmp_path))
    started, written = _outputs(result)
    assert "Process running with session ID" in started
    assert "42" in written and "Process exited with code 0" in written
    assert result.final_output == "42"


async def test_errors_are_mapped(berth_url: str, bc: Berth) -> None:
    # The daemon is down (nothing listens there): berth's typed error names the URL.
    async with BerthSandboxClient("http://127.0.0.1:9") as down:
        with pytest.raises(DaemonUnreachable, match="127.0.0.1:9"):
            await down.create()
        state = BerthSandboxSessionState(sandbox_id="sb-gone", manifest=Manifest(), snapshot=NoopSnapshot(id="x"))
        with pytest.raises(DaemonUnreachable):  # not silently replaced by a new sandbox
            await down.resume(state)
    # Options are checked where they are made.
    with pytest.raises(pydantic.ValidationError, match="exposed_ports"):
        BerthSandboxClientOptions(exposed_ports=(70000,))
    with pytest.raises(pydantic.ValidationError, match="memory"):
        BerthSandboxClientOptions(memory=-1)

    async with BerthSandboxClient(berth_url) as sbx:
        # What the daemon refuses at create comes as its typed error, naming the field.
        with pytest.raises(Exception, match='runtime: "nope"'):
            await sbx.create(options=BerthSandboxClientOptions(runtime="nope"))
        async with await sbx.create() as session:
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read(Path("missing.txt"))
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read_bounded(Path("missing.txt"), max_bytes=10)
            with pytest.raises(InvalidManifestPathError):
                await session.read(Path("../etc/passwd"))
            await session.mkdir(Path("adir"))
            with pytest.raises(WorkspaceArchiveWriteError) as ei:
                await session.write(Path("adir"), io.BytesIO(b"x"))
            assert ei.value.context["backend"] == "berth"
            # The sandbox deleted behind the session's back: exec is a transport error with berth's cause.
            bc.delete(_inner(session).sandbox_id)
            with pytest.raises(ExecTransportError) as ee:
                await session.exec("true")
            assert isinstance(ee.value.cause, NotFound)
            assert not await session.running()
        # Starting a session whose sandbox is gone says so.
        gone = await sbx.create()
        bc.delete(_inner(gone).sandbox_id)
        with pytest.raises(WorkspaceStartError, match="not found"):
            await gone.start()


def test_example_runs(berth_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("example_openai_agents", REPO / "examples" / "openai_agents.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setenv("BERTH_URL", berth_url)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "python3 --version > python.txt && cat python.txt"}, call_id="c1")],
            [assistant_message("Python 3 it is; python.txt has it.")],
        ]
    )
    output = asyncio.run(example.main(model=model, snapshot=LocalSnapshotSpec(base_path=tmp_path)))
    model.assert_complete()
    assert output == "Python 3 it is; python.txt has it."
    assert "Output:\nPython 3." in json.dumps(model.last_call.input if model.last_call else "", default=str).replace("\\n", "\n")
    # The workspace the run left, in its snapshot.
    (snap,) = tmp_path.glob("*.tar")
    with tarfile.open(snap) as tf:
        note = tf.extractfile("python.txt")
        assert note is not None and note.read().startswith(b"Python 3.")


async def test_agent_runs_as_a_manifest_user(sbx: BerthSandboxClient, tmp_path: Path) -> None:
    # run_as adds the user to the manifest; the SDK makes it (as root) and the tools act as it.
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "echo I am $(id -un) in $(pwd); cat hello.txt"}, call_id="c1")],
            [assistant_message("ok")],
        ]
    )
    from agents.sandbox.entries import File

    agent = SandboxAgent(
        name="alice-agent",
        model=model,
        instructions="Work.",
        run_as="alice",
        default_manifest=Manifest(entries={"hello.txt": File(content=b"hello from the manifest\n")}),
    )
    result = await Runner.run(agent, "who are you?", run_config=_sandbox_config(sbx, tmp_path))
    (out,) = _outputs(result)
    assert out.endswith("Output:\nI am alice in /workspace\nhello from the manifest\n")
