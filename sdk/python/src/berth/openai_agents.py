"""A sandbox client for the OpenAI Agents SDK (``agents.sandbox``) served by berth.

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from berth.openai_agents import BerthSandboxClient, BerthSandboxClientOptions

    agent = SandboxAgent(name="coder", instructions="...")
    async with BerthSandboxClient() as client:  # $BERTH_URL, $BERTH_API_KEY
        result = await Runner.run(agent, "task", run_config=RunConfig(sandbox=SandboxRunConfig(
            client=client, options=BerthSandboxClientOptions(image="python:3.12-slim", allow=["pypi.org"]))))

Each session is one berth sandbox. Commands run through berth's exec (its
timeout kills the whole process group), files move with berth's file and
archive calls, ``exec_command(tty=true)`` and ``write_stdin`` are a berth
background process on a pseudo-terminal with an attachment, and an exposed
port is the daemon's per-port URL. The workspace (``Manifest.root``,
``/workspace`` by default) is made at start, as root, and given to the
sandbox's user; it is also the sandbox's working directory.

The session state (:class:`BerthSandboxSessionState`) holds the sandbox id and
the options it was made with, never the daemon's URL or API key (the client
has those), so another process can resume the same sandbox. What happens to
the sandbox when the SDK releases a session is ``on_exit``: ``"delete"`` (the
default, as the SDK's hosted providers do: a resume makes a new sandbox and
restores the workspace from the run's snapshot), ``"stop"`` (files kept, no
processes, no CPU or memory: a resume starts it again), ``"pause"``
(processes frozen) or ``"keep"`` (left running; the sandbox's idle timeout
still applies).
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

try:
    from agents.sandbox.errors import (
        ExecNonZeroError,
        ExecTimeoutError,
        ExecTransportError,
        ExposedPortUnavailableError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
        WorkspaceStartError,
        WorkspaceWriteTypeError,
    )
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.dependencies import Dependencies
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.session.pty_output import collect_pty_output
    from agents.sandbox.session.pty_types import (
        PTY_PROCESSES_MAX,
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        process_id_to_prune_from_meta,
        resolve_pty_write_yield_time_ms,
    )
    from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.session.sandbox_session import SandboxSession
    from agents.sandbox.session.sandbox_session_state import SandboxSessionState
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
    from agents.sandbox.util.tar_utils import (
        UnsafeTarMemberError,
        should_skip_tar_member,
        strip_tar_member_prefix,
        validate_tar_bytes,
    )
    from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path, sandbox_path_str
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError(
        "berth.openai_agents needs the OpenAI Agents SDK: pip install 'berth[openai-agents]'"
    ) from e

import httpx
from pydantic import Field, field_validator

from ._client import AsyncBerth, AsyncSandbox
from ._terminal import AsyncTerminal
from .errors import BerthError, Conflict, DaemonUnreachable, InvalidArgument, NotFound

__all__ = [
    "BerthSandboxClient",
    "BerthSandboxClientOptions",
    "BerthSandboxSession",
    "BerthSandboxSessionState",
    "SESSION_LABEL",
    "OnExit",
]

OnExit = Literal["delete", "stop", "pause", "keep"]
# The label that ties a sandbox to its SDK session.
SESSION_LABEL = "openai-agents/session"
# A PTY's size: the SDK's tools read output, they do not draw a screen.
_PTY_SIZE = (24, 80)
# How long a PTY start waits for output when the caller names no yield time.
_PTY_START_YIELD_MS = 10_000
_PTY_WRITE_YIELD_MS = 250
# What root runs on the SDK's behalf (the workspace root, the manifest's users, groups and
# modes) finds its programs only here, with none of the manifest's environment: berth resolves
# argv[0] with the exec's PATH, and the manifest's (or the options') PATH may name a directory
# the sandbox's user writes (a venv in the workspace), where it could plant a "chmod" for root.
_ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ROOT_ENV = {"PATH": _ROOT_PATH}
# A persisted workspace's tar is held in memory up to this, then spooled to disk.
_ARCHIVE_SPOOL_BYTES = 16 << 20
T = TypeVar("T")
# A bounded read's head -c answers these for a missing path and a non-file.
_MISSING, _NOT_FILE = 44, 45


class BerthSandboxClientOptions(BaseSandboxClientOptions):
    """How to make a berth sandbox for a session (every field optional).

    ``image``: "host" (the daemon's default: the host's system read-only under a
    private writable layer), an OCI reference, a template or ``snapshot:NAME``.
    ``runtime``: the isolation tier ("native", "gvisor", ...; default the daemon's).
    ``labels``: labels of the sandbox (``openai-agents/session`` is added).
    ``env``: environment of every command (the manifest's environment is added per command).
    ``user``: the sandbox's user (default the image's, "user" on "host").
    ``memory`` and ``disk`` in bytes, ``cpus`` (fractional), ``pids``: limits.
    ``network``: "none", "allowlist", "open" or a berth policy dict; ``allow``:
    domains reachable (makes an allowlist). ``exposed_ports``: ports inside that
    ``resolve_exposed_port`` may give a URL for. ``idle_timeout`` and
    ``delete_after``: berth's lifetimes, in seconds. ``on_exit``: what releasing
    the session does to the sandbox ("delete", "stop", "pause" or "keep").
    ``max_workspace_archive_bytes``: the most of the workspace's tar that
    ``persist_workspace`` takes (1 GiB by default; it is spooled to a temporary
    file, not held in memory, and a larger one is refused).
    ``max_read_bytes``: the largest file ``read`` returns (1 GiB by default;
    spooled the same way: the sandbox decides a file's size, a sparse one
    costs it nothing).
    """

    type: Literal["berth"] = "berth"
    image: str | None = None
    runtime: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    memory: int | None = Field(default=None, gt=0)
    cpus: float | None = Field(default=None, gt=0)
    pids: int | None = Field(default=None, gt=0)
    disk: int | None = Field(default=None, gt=0)
    network: str | dict[str, Any] | None = None
    allow: tuple[str, ...] = ()
    exposed_ports: tuple[int, ...] = ()
    idle_timeout: float | None = Field(default=None, ge=0)
    delete_after: float | None = Field(default=None, ge=0)
    on_exit: OnExit = "delete"
    max_workspace_archive_bytes: int = Field(default=1 << 30, gt=0)
    max_read_bytes: int = Field(default=1 << 30, gt=0)

    @field_validator("exposed_ports")
    @classmethod
    def _ports(cls, ports: tuple[int, ...]) -> tuple[int, ...]:
        for p in ports:
            if not 1 <= p <= 65535:
                raise ValueError(f"exposed_ports: {p} is not a TCP port (1-65535)")
        return ports

    def _create_kwargs(self, manifest_root: str, session_id: uuid.UUID) -> dict[str, Any]:
        return {
            "image": self.image,
            "runtime": self.runtime,
            "labels": {**self.labels, SESSION_LABEL: session_id.hex},
            "env": self.env or None,
            "user": self.user,
            # Execs without a cwd of their own (berth's CLI, terminals) start in the workspace.
            "workdir": manifest_root,
            "memory": self.memory,
            "cpus": self.cpus,
            "pids": self.pids,
            "disk": self.disk,
            "network": self.network,
            "allow": list(self.allow) or None,
            "idle_timeout": self.idle_timeout,
            "delete_after": self.delete_after,
        }


class BerthSandboxSessionState(SandboxSessionState):
    """What resumes a session: the sandbox's id and the options it was made with
    (to make a replacement if it is gone)."""

    type: Literal["berth"] = "berth"
    sandbox_id: str
    options: BerthSandboxClientOptions = Field(default_factory=BerthSandboxClientOptions)


@dataclass
class _Pty:
    """A process started by pty_exec_start, and what it printed not yet returned."""

    pid: int
    terminal: AsyncTerminal
    tty: bool
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    reader: asyncio.Task[None] | None = None
    last_used: float = field(default_factory=time.monotonic)


def _user_name(user: str | User | None) -> str | None:
    return user.name if isinstance(user, User) else user


def _as_bytes(data: Any) -> bytes | None:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return None


def _read_all(data: io.IOBase) -> Any:
    return data.read()


class _ArchiveTooLarge(Exception):
    """A download from the sandbox went past its cap (max_workspace_archive_bytes or max_read_bytes)."""


async def _spool(chunks: AsyncGenerator[bytes, None], spool: Any, cap: int) -> None:
    """Copy ``chunks`` (a download from the sandbox) into ``spool`` from its start,
    raising _ArchiveTooLarge past ``cap`` bytes; the download ends either way."""
    spool.seek(0)
    spool.truncate()
    got = 0
    try:
        async for chunk in chunks:
            got += len(chunk)
            if got > cap:
                raise _ArchiveTooLarge
            spool.write(chunk)
    finally:
        await chunks.aclose()


class BerthSandboxSession(BaseSandboxSession):
    """One berth sandbox as an Agents SDK sandbox session."""

    state: BerthSandboxSessionState

    def __init__(self, *, state: BerthSandboxSessionState, sandbox: AsyncSandbox) -> None:
        self.state = state
        self._sb = sandbox
        # The workspace root exists (made at start, or seen): execs may run in it.
        self._root_ready = state.workspace_root_ready
        self._released = False
        self._pty_lock = asyncio.Lock()
        self._ptys: dict[int, _Pty] = {}
        self._pty_ids: set[int] = set()

    @property
    def sandbox(self) -> AsyncSandbox:
        """The berth sandbox (for anything the SDK's interface does not cover)."""
        return self._sb

    @property
    def sandbox_id(self) -> str:
        return self.state.sandbox_id

    # lifecycle

    async def _ensure_backend_started(self) -> None:
        self._released = False
        info = await self._sb.refresh()
        if info.state == "stopped":
            await self._sb.start()
        elif info.state == "paused":
            await self._sb.resume()
        await self._make_root()

    async def _make_root(self) -> None:
        """Make the workspace root, as root, for the sandbox's user (left as it is if it exists)."""
        root = sandbox_path_str(self.state.manifest.root)
        owner = str(self._sb.info.raw.get("user") or "")
        script = 'if [ ! -d "$1" ]; then mkdir -p -- "$1" || exit 1; '
        if owner not in ("", "root", "0") and not owner.startswith("0:"):
            # name: (or uid:) gives the user's login group too; a uid without a passwd entry has none.
            script += 'chown -- "$2:" "$1" 2>/dev/null || chown -- "$2" "$1" || exit 1; '
        script += "fi"
        res = await self._sb.exec(["/bin/sh", "-c", script, "sh", root, owner], user="root", cwd="/", env=_ROOT_ENV)
        if not res.ok:
            raise WorkspaceStartError(
                path=Path(root),
                context={"backend": "berth", "reason": "workspace_root_setup_failed", "stderr": res.stderr},
                message=f"failed to start session: making the workspace root {root} failed: {res.stderr.strip()}",
            )
        self._root_ready = True

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run a berth call; if the daemon refused it, before it ran, because the sandbox
        was stopped (its idle timeout, berth stop) or paused meanwhile, start or resume
        it and run the call once more. A conflict without that reason (the sandbox
        stopped while the call ran: a command may have started) is raised, never retried."""
        try:
            return await op()
        except Conflict as e:
            if not await self._sb.recover(e):
                raise
            return await op()

    def _wrap_start_error(self, error: Exception) -> Exception:
        if isinstance(error, BerthError):
            return WorkspaceStartError(
                path=Path(sandbox_path_str(self.state.manifest.root)),
                context={"backend": "berth", "sandbox_id": self.state.sandbox_id, "error_class": error.error_class},
                cause=error,
                message=f"failed to start session: sandbox {self.state.sandbox_id}: {error.message}",
            )
        return error

    def _mark_workspace_root_ready_from_probe(self) -> None:
        super()._mark_workspace_root_ready_from_probe()
        self._root_ready = True

    async def running(self) -> bool:
        try:
            return (await self._sb.refresh()).state == "running"
        except BerthError:
            return False

    async def _shutdown_backend(self) -> None:
        if self._released:
            return
        self._released = True
        how = self.state.options.on_exit
        try:
            if how == "delete":
                await self._sb.delete()
            elif how == "stop":
                await self._sb.stop()
            elif how == "pause":
                await self._sb.pause()
        except NotFound:
            pass

    # exec

    def supports_pty(self) -> bool:
        return True

    async def _env(self) -> dict[str, str]:
        return await self.state.manifest.environment.resolve()

    def _cwd(self) -> str:
        return sandbox_path_str(self.state.manifest.root) if self._root_ready else "/"

    async def exec(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
    ) -> ExecResult:
        # berth runs a command as any user itself: no sudo in the sandbox.
        if user is None:
            return await super().exec(*command, timeout=timeout, shell=shell)
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        return await self._run(argv, timeout=timeout, user=_user_name(user))

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        return await self._run([str(c) for c in command], timeout=timeout, user=None)

    async def _run(
        self,
        argv: list[str],
        *,
        timeout: float | None,
        user: str | None,
        max_output_bytes: int | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``argv`` with ``env`` (default the manifest's environment)."""
        if timeout is not None:
            # berth reads 0 as no timeout.
            timeout = max(timeout, 0.001)
        try:
            if env is None:
                env = await self._env()
            res = await self._call(lambda: self._sb.exec(
                argv, timeout=timeout, user=user, cwd=self._cwd(), env=env, max_output_bytes=max_output_bytes
            ))
        except BerthError as e:
            raise ExecTransportError(
                command=argv,
                context={"backend": "berth", "sandbox_id": self.state.sandbox_id, "error_class": e.error_class},
                cause=e,
                message=f"berth exec failed: {e.message}",
                retryable=e.error_class == "unavailable",
            ) from e
        if res.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout, context={"backend": "berth", "duration_ms": res.duration_ms})
        stderr = res.stderr_bytes
        if max_output_bytes is None:
            # Say so where the model reads it (stdout stays as the command wrote it, for parsers).
            for name, cut in (("stdout", res.stdout_truncated), ("stderr", res.stderr_truncated)):
                if cut:
                    stderr += f"\n[berth: {name} was cut at the sandbox's output limit]\n".encode()
        return ExecResult(stdout=res.stdout_bytes, stderr=stderr, exit_code=res.exit_code)

    async def _exec_checked_nonzero(self, *command: str | Path) -> ExecResult:
        # The SDK makes the manifest's users and groups (groupadd, useradd, usermod) and sets
        # its entries' groups and modes (chgrp, chmod) with this: administration, done as root,
        # with a PATH of system directories only and none of the manifest's environment.
        res = await self._run([str(c) for c in command], timeout=None, user="root", env=_ROOT_ENV)
        if not res.ok():
            raise ExecNonZeroError(res, command=command)
        return res

    # files

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self.state.sandbox_id

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        # Symlinks are resolved in the sandbox, where the SDK's workspace policy is checked.
        return await self._validate_remote_path_access(path, for_write=for_write)

    async def read(self, path: Path | str, *, user: str | User | None = None) -> io.IOBase:
        error_path = posix_path_as_path(coerce_posix_path(path))
        where = sandbox_path_str(await self._validate_path_access(path))
        cap = self.state.options.max_read_bytes
        spool = tempfile.SpooledTemporaryFile(max_size=_ARCHIVE_SPOOL_BYTES)
        try:
            await self._call(lambda: _spool(self._sb.download_stream(where, user=_user_name(user)), spool, cap))
        except _ArchiveTooLarge:
            spool.close()
            detail = f"{where} is larger than max_read_bytes ({cap} bytes; sparse files count in full)"
            err = WorkspaceArchiveReadError(
                path=error_path, context={"backend": "berth", "reason": "file_too_large", "max_bytes": cap, "detail": detail}
            )
            err.message = f"{err.message}: {detail}"
            err.args = (err.message,)
            raise err from None
        except NotFound as e:
            spool.close()
            raise WorkspaceReadNotFoundError(path=error_path, context={"backend": "berth"}, cause=e) from e
        except BerthError as e:
            spool.close()
            raise WorkspaceArchiveReadError(
                path=error_path, context={"backend": "berth", "error_class": e.error_class, "reason": e.reason or ""}, cause=e
            ) from e
        spool.seek(0)
        return cast("io.IOBase", spool)

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        where = sandbox_path_str(await self._validate_path_access(path))
        script = f'[ -e "$1" ] || exit {_MISSING}; [ -f "$1" ] || exit {_NOT_FILE}; head -c "$2" < "$1"'
        res = await self._run(["sh", "-c", script, "sh", where, str(max_bytes)], timeout=60.0, user=None,
                              max_output_bytes=max_bytes)
        if res.exit_code == _MISSING:
            raise WorkspaceReadNotFoundError(path=path)
        if not res.ok():
            raise WorkspaceArchiveReadError(path=path, context={"backend": "berth", "exit_code": res.exit_code})
        return res.stdout[:max_bytes]

    async def write(self, path: Path | str, data: io.IOBase, *, user: str | User | None = None) -> None:
        error_path = posix_path_as_path(coerce_posix_path(path))
        payload = _as_bytes(_read_all(data))
        if payload is None:
            raise WorkspaceWriteTypeError(path=error_path, actual_type=type(data).__name__)
        where = sandbox_path_str(await self._validate_path_access(path, for_write=True))
        try:
            await self._call(lambda: self._sb.upload(where, payload, user=_user_name(user)))
        except BerthError as e:
            raise WorkspaceArchiveWriteError(
                path=error_path, context={"backend": "berth", "error_class": e.error_class, "reason": e.reason or ""}, cause=e
            ) from e

    # workspace archives

    async def persist_workspace(self) -> io.IOBase:
        root = sandbox_path_str(self.state.manifest.root)
        name = posixpath.basename(root.rstrip("/"))
        cap = self.state.options.max_workspace_archive_bytes
        # The guest's files decide the tar's size (a sparse file's holes come in full): it goes
        # to a temporary file past a few MiB, never whole into memory, and only up to the cap.
        spool = tempfile.SpooledTemporaryFile(max_size=_ARCHIVE_SPOOL_BYTES)
        try:
            # The tree comes under its own name; members are made relative to the root below.
            await self._call(lambda: _spool(self._sb.download_archive_stream(root), spool, cap))
        except _ArchiveTooLarge:
            spool.close()
            detail = (
                f"the workspace's archive is over max_workspace_archive_bytes ({cap} bytes; sparse files count in "
                "full): remove large files from the workspace, skip them with register_persist_workspace_skip_path, "
                "or raise the option"
            )
            err = WorkspaceArchiveReadError(
                path=Path(root), context={"backend": "berth", "reason": "workspace_archive_too_large", "max_bytes": cap,
                                          "detail": detail},
            )
            err.message = f"{err.message}: {detail}"
            err.args = (err.message,)
            raise err from None
        except BerthError as e:
            spool.close()
            raise WorkspaceArchiveReadError(
                path=Path(root), context={"backend": "berth", "error_class": e.error_class}, cause=e,
                retryable=e.error_class == "unavailable",
            ) from e
        except httpx.HTTPError as e:
            spool.close()
            raise WorkspaceArchiveReadError(
                path=Path(root), context={"backend": "berth", "reason": f"the archive's stream broke: {e}"}, cause=e,
                retryable=True,
            ) from e
        spool.seek(0)
        skip = self._persist_workspace_skip_relpaths()
        kept = tempfile.TemporaryFile()
        try:
            # Plain tar only (berth sends it so): nothing the guest wrote is decompressed here.
            with spool, tarfile.open(fileobj=spool, mode="r|") as src, tarfile.open(fileobj=kept, mode="w|") as dst:
                for member in src:
                    if skip and should_skip_tar_member(member.name, skip_rel_paths=skip, root_name=name):
                        continue
                    if member.isreg():
                        dst.addfile(member, src.extractfile(member))
                    else:
                        dst.addfile(member)
            kept.seek(0)
            return strip_tar_member_prefix(cast(io.IOBase, kept), prefix=name, relativize_symlinks_under=root)
        except (tarfile.TarError, UnsafeTarMemberError, OSError) as e:
            kept.close()
            raise WorkspaceArchiveReadError(path=Path(root), context={"backend": "berth", "reason": str(e)}, cause=e) from e

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = sandbox_path_str(self.state.manifest.root)
        raw = _as_bytes(_read_all(data))
        if raw is None:
            raise WorkspaceWriteTypeError(path=Path(root), actual_type=type(data).__name__)
        try:
            validate_tar_bytes(raw, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"reason": "unsafe_or_invalid_tar", "member": e.member, "detail": str(e)}, cause=e
            ) from e
        try:
            if not self._root_ready:
                await self._make_root()
            await self._call(lambda: self._sb.upload_archive(root, raw))
        except BerthError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"backend": "berth", "error_class": e.error_class, "reason": e.reason or ""}, cause=e
            ) from e

    # ports

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        try:
            await self._sb.refresh()  # the access token as it is now
            url = await self._sb.url(port, host_form=True)
        except BerthError as e:
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable",
                context={"backend": "berth", "detail": e.message}, cause=e,
            ) from e
        u = urlsplit(url)
        tls = u.scheme == "https"
        return ExposedPortEndpoint(host=u.hostname or "", port=u.port or (443 if tls else 80), tls=tls, query=u.query)

    # PTY: a berth background process (on a terminal with tty) and an attachment to it

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        try:
            env = await self._env()
            pid = await self._call(lambda: self._sb.start_process(
                argv,
                tty=_PTY_SIZE if tty else None,
                # Without a terminal stdin is closed, as the SDK's other providers do.
                open_stdin=tty,
                cwd=self._cwd(),
                user=_user_name(user),
                env=env,
                timeout=max(timeout, 0.001) if timeout is not None else None,
            ))
        except BerthError as e:
            # Refused before it ran: the SDK's shell tool may run the command once without a PTY
            # instead. Not so after a reasonless conflict (the sandbox stopped while the call ran)
            # or a lost connection: the process may have started.
            may_have_run = (isinstance(e, Conflict) and e.reason is None) or isinstance(e, DaemonUnreachable)
            raise ExecTransportError(
                command=argv, context={"backend": "berth", "error_class": e.error_class, "retry_safe": not may_have_run},
                cause=e, message=f"berth process start failed: {e.message}",
            ) from e
        try:
            terminal = await self._sb.attach(pid)
        except BerthError as e:
            try:
                await self._sb.kill_process(pid)
            except BerthError:
                pass
            raise ExecTransportError(
                command=argv, context={"backend": "berth", "error_class": e.error_class, "pid": pid}, cause=e,
                message=f"berth attach to process {pid} failed: {e.message}",
            ) from e
        entry = _Pty(pid=pid, terminal=terminal, tty=tty)
        entry.reader = asyncio.create_task(self._pump(entry))
        async with self._pty_lock:
            process_id = allocate_pty_process_id(self._pty_ids)
            self._pty_ids.add(process_id)
            pruned = self._prune()
            self._ptys[process_id] = entry
        if pruned is not None:
            await self._end(pruned)
        yield_ms = _PTY_START_YIELD_MS if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._ptys, session_id=session_id)
        if chars:
            if not entry.tty:
                # The SDK's write_stdin tool turns this message into advice to use tty=true.
                raise RuntimeError("stdin is not available for this process")
            try:
                await entry.terminal.send(chars)
            except BerthError as e:
                raise ExecTransportError(
                    command=("write_stdin", str(session_id)), context={"backend": "berth", "pid": entry.pid}, cause=e,
                    message=f"berth write to process {entry.pid} failed: {e.message}",
                ) from e
        entry.last_used = time.monotonic()
        yield_ms = _PTY_WRITE_YIELD_MS if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == "")
        return await self._update(session_id, entry, wait_ms, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._ptys.values())
            self._ptys.clear()
            self._pty_ids.clear()
        for entry in entries:
            await self._end(entry)

    async def _pump(self, entry: _Pty) -> None:
        """Move the attachment's output into the entry until the exit."""
        try:
            async for ev in entry.terminal:
                if ev.type in ("stdout", "stderr") and ev.data:
                    async with entry.lock:
                        entry.chunks.append(ev.data)
                    entry.notify.set()
                elif ev.type == "exit" and ev.result is not None:
                    entry.exit_code = ev.result.exit_code
        except BerthError:
            pass
        finally:
            entry.closed.set()
            entry.notify.set()

    async def _update(self, process_id: int, entry: _Pty, wait_ms: int, max_output_tokens: int | None) -> PtyExecUpdate:
        output, tokens, done = await collect_pty_output(
            output_chunks=entry.chunks,
            output_lock=entry.lock,
            output_notify=entry.notify,
            is_done=entry.closed.is_set,
            yield_time_ms=wait_ms,
            max_output_tokens=max_output_tokens,
        )
        if not done:
            return PtyExecUpdate(process_id=process_id, output=output, exit_code=None, original_token_count=tokens)
        async with self._pty_lock:
            self._ptys.pop(process_id, None)
            self._pty_ids.discard(process_id)
        await self._end(entry)
        return PtyExecUpdate(process_id=None, output=output, exit_code=entry.exit_code, original_token_count=tokens)

    def _prune(self) -> _Pty | None:
        if len(self._ptys) < PTY_PROCESSES_MAX:
            return None
        pid = process_id_to_prune_from_meta([(k, e.last_used, e.closed.is_set()) for k, e in self._ptys.items()])
        if pid is None:
            return None
        self._pty_ids.discard(pid)
        return self._ptys.pop(pid, None)

    async def _end(self, entry: _Pty) -> None:
        """Kill the process if it still runs and drop its attachment."""
        if not entry.closed.is_set():
            try:
                await self._sb.kill_process(entry.pid)
            except BerthError:
                pass
        try:
            await entry.terminal.close()
        except Exception:  # noqa: BLE001 - a broken connection is closed too
            pass
        if entry.reader is not None and entry.reader is not asyncio.current_task():
            entry.reader.cancel()
            await asyncio.gather(entry.reader, return_exceptions=True)


class BerthSandboxClient(BaseSandboxClient[BerthSandboxClientOptions]):
    """Makes and resumes berth sandboxes for the Agents SDK.

    ``url`` defaults to ``$BERTH_URL`` (else http://127.0.0.1:7680), ``api_key``
    to ``$BERTH_API_KEY``; or pass an :class:`~berth.AsyncBerth` as ``berth``.
    ``async with`` (or :meth:`aclose`) closes the connection it made.
    """

    backend_id = "berth"
    supports_default_options = True

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        berth: AsyncBerth | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        if berth is not None and (url is not None or api_key is not None):
            raise InvalidArgument("berth: pass a client or url and api_key, not both")
        self._owns_berth = berth is None
        self.berth = berth if berth is not None else AsyncBerth(url, api_key=api_key)
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def __aenter__(self) -> BerthSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_berth:
            await self.berth.aclose()

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: BerthSandboxClientOptions | None = None,
    ) -> SandboxSession:
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        options = options if options is not None else BerthSandboxClientOptions()
        if not isinstance(options, BerthSandboxClientOptions):
            raise TypeError(f"options: BerthSandboxClient needs BerthSandboxClientOptions, not {type(options).__name__}")
        session_id = uuid.uuid4()
        sb = await self.berth.create(ephemeral=False, **options._create_kwargs(sandbox_path_str(manifest.root), session_id))
        state = BerthSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=sb.id,
            options=options,
            exposed_ports=options.exposed_ports,
        )
        return self._wrap_session(BerthSandboxSession(state=state, sandbox=sb), instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Release the session's sandbox as its ``on_exit`` says (delete it by default)."""
        inner = session._inner
        if not isinstance(inner, BerthSandboxSession):
            raise TypeError("BerthSandboxClient.delete expects a session it made")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The session of ``state``: its sandbox if it is still there (started if
        stopped, resumed if paused, at start), else a new one made with the same
        options, whose workspace start restores from the state's snapshot."""
        if not isinstance(state, BerthSandboxSessionState):
            raise TypeError("BerthSandboxClient.resume expects a BerthSandboxSessionState")
        state.assert_path_grants_rebound()
        try:
            sb = await self.berth.get(state.sandbox_id)
            found = True
        except NotFound:
            found = False
        if not found:
            sb = await self.berth.create(
                ephemeral=False, **state.options._create_kwargs(sandbox_path_str(state.manifest.root), state.session_id)
            )
            state.sandbox_id = sb.id
            state.workspace_root_ready = False
        inner = BerthSandboxSession(state=state, sandbox=sb)
        inner._set_start_state_preserved(found, system=found)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, BerthSandboxSessionState)

