"""A deepagents sandbox backend served by berth.

    from deepagents import create_deep_agent
    from berth import Berth
    from berth.deepagents import BerthSandbox

    agent = create_deep_agent(model=..., backend=BerthSandbox(sandbox=Berth().create(ephemeral=False)))

    # or a new sandbox with a network policy, the key added outside it:
    backend = BerthSandbox.create(allow=["pypi.org", "*.pythonhosted.org"],
                                  network={"secrets": [{"secret": "openai", "host": "api.openai.com",
                                                        "env": "OPENAI_API_KEY"}]})

``execute`` runs the command in the sandbox; ``upload_files`` and
``download_files`` use berth's batch transfers. ``ls``, ``read``, ``write``,
``edit``, ``glob`` and ``grep`` are one berth API call each (served by the
sandbox's guest agent), where deepagents' ``BaseSandbox`` would pipe Python
scripts through ``execute``; their results and error texts follow
``BaseSandbox``'s.

``fork(n)`` branches: n backends over copies of the sandbox's files, for
agents that try several ways; ``backend.sandbox.apply(winner.sandbox)``
merges the one that worked back.

Written for an agent that runs for days:

- A sandbox stopped by its idle timeout (or paused) is started (resumed) by
  the next call, which then runs as if nothing happened (``auto_start``, on
  by default).
- deepagents' own files (``/large_tool_results/``, ``/conversation_history/``)
  can be written whatever the sandbox's user: their directories are made for
  that user, as root, the first time a write there is refused.
- Errors the model cannot fix (the sandbox was deleted, the daemon does not
  answer) reach the model as a plain sentence that says so; the daemon's own
  message, with ids and routes for an operator, goes to the
  ``berth.deepagents`` logger with the exception.

:class:`BerthProvider` is the ``deepagents_code.sandbox_providers`` entry
point named ``berth``, so ``deepagents-code`` can pick berth as its sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import posixpath
from collections.abc import Callable
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from deepagents.backends.protocol import (
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)
from deepagents.backends.sandbox import BaseSandbox
from deepagents.backends.utils import _get_backend_read_file_type, normalize_read_bounds

from ._client import Berth, Sandbox
from .errors import (
    SANDBOX_GONE,
    SANDBOX_PAUSED,
    SANDBOX_STOPPED,
    BerthError,
    DaemonUnreachable,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)

_log = logging.getLogger("berth.deepagents")

ARTIFACT_DIRS = ("/large_tool_results", "/conversation_history")
"""Where deepagents writes oversized tool results and offloaded history (its
default artifacts root is ``/``)."""

_T = TypeVar("_T")

# The limits and texts of deepagents' BaseSandbox.read, kept identical.
_MAX_OUTPUT_BYTES = 500 * 1024
_MAX_BINARY_BYTES = 500 * 1024
_TRUNCATION_MSG = "\n\n" + (
    "[Output was truncated due to size limits. "
    "This paginated read result exceeded the sandbox stdout limit. "
    "Continue reading with a larger offset or smaller limit to inspect the rest of the file.]"
)
_EMPTY_FILE = "System reminder: File exists but has empty contents"


def _code(e: BerthError) -> str:
    """A berth error as the short code BaseSandbox's scripts report."""
    if isinstance(e, NotFound) or e.reason == "not_directory":
        return "file_not_found"
    if isinstance(e, PermissionDenied):
        return "permission_denied"
    if e.reason in ("is_directory", "not_regular_file"):
        return "not_a_file"
    if e.reason == "invalid_path":
        return "invalid_path"
    return e.message

DEFAULT_TIMEOUT = 30 * 60
"""Seconds an ``execute`` may run when the agent gives no timeout."""


def _for_model(e: BerthError) -> str | None:
    """What the model is told of an error about the sandbox itself (rather
    than the path or command it gave), or None for an error it can act on."""
    if e.reason == SANDBOX_GONE:
        return "the sandbox was deleted: its files and programs are gone, and no tool can use it. Tell the user; a new sandbox is needed."
    if e.reason == SANDBOX_STOPPED:
        return "the sandbox is stopped, so no tool can use it until it is started again. Tell the user."
    if e.reason == SANDBOX_PAUSED:
        return "the sandbox is paused, so no tool can use it until it is resumed. Tell the user."
    if isinstance(e, Unauthenticated):
        return "the sandbox service refused this agent's credentials, so no tool can use it. Tell the user."
    if isinstance(e, Unavailable) and (isinstance(e, DaemonUnreachable) or not e.reason):
        return "the sandbox service is not answering right now. Try again in a moment; tell the user if it keeps failing."
    return None

_ERROR_CODES = {
    "not_found": "file_not_found",
    "permission_denied": "permission_denied",
}
_REASON_CODES = {
    "is_directory": "is_directory",
    "invalid_path": "invalid_path",
    "not_directory": "file_not_found",
}


def _file_error(err: dict[str, Any] | None) -> str | None:
    """Map a berth per-file error onto deepagents' FileOperationError codes."""
    if not err:
        return None
    reason = err.get("reason") or ""
    if reason in _REASON_CODES:
        return _REASON_CODES[reason]
    code = _ERROR_CODES.get(err.get("class", ""))
    return code or err.get("message") or err.get("class") or "error"


class BerthSandbox(BaseSandbox):
    """deepagents' ``SandboxBackendProtocol`` over one berth sandbox."""

    def __init__(
        self, *, sandbox: Sandbox, timeout: int = DEFAULT_TIMEOUT, max_output_bytes: int | None = None, auto_start: bool = True
    ) -> None:
        """``auto_start``: start (or resume) the sandbox when a call finds it
        stopped (or paused), then make the call again."""
        if timeout <= 0:
            msg = f"timeout must be positive, got {timeout}"
            raise ValueError(msg)
        self._sb = sandbox
        self._timeout = timeout
        self._max_output = max_output_bytes
        self._auto_start = auto_start
        self._artifacts_made: set[str] = set()

    def _call(self, fn: Callable[[], _T]) -> _T:
        """``fn()``; if it finds the sandbox stopped or paused and auto_start
        is on, start or resume it and call ``fn()`` once more."""
        try:
            return fn()
        except BerthError as e:
            if not self._auto_start or not self._sb.recover(e):
                raise
            _log.info("berth sandbox %s was %s; the backend brought it back", self._sb.id, (e.reason or "").removeprefix("sandbox_"))
        return fn()

    def _model_error(self, e: BerthError) -> str | None:
        """The model's sentence for an error about the sandbox itself (the
        operator's detail is logged), or None."""
        text = _for_model(e)
        if text is not None:
            _log.warning("berth sandbox %s: %s", self._sb.id, e, exc_info=e)
        return text

    @classmethod
    def create(
        cls,
        client: Berth | None = None,
        *,
        timeout: int = DEFAULT_TIMEOUT,
        max_output_bytes: int | None = None,
        auto_start: bool = True,
        **create: Any,
    ) -> BerthSandbox:
        """A backend on a new sandbox (kept until deleted). ``create`` takes
        :meth:`berth.Berth.create`'s keywords: image, limits, labels, ``network``
        (a mode or a policy dict with allow, deny and secrets) and ``allow``."""
        client = client or Berth()
        return cls(sandbox=client.create(ephemeral=False, **create), timeout=timeout, max_output_bytes=max_output_bytes, auto_start=auto_start)

    @property
    def id(self) -> str:
        return self._sb.id

    @property
    def sandbox(self) -> Sandbox:
        """The berth sandbox behind this backend."""
        return self._sb

    def fork(
        self, n: int = 1, *, labels: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None
    ) -> list[BerthSandbox]:
        """``n`` new backends, each over a copy of this sandbox's files as they are
        now (:meth:`berth.Sandbox.fork`: no processes; ``labels`` for every copy, or
        one mapping per copy), with this backend's timeout and output bound. The
        copies are kept until deleted (``backend.sandbox.delete()``)."""
        copies = self._call(lambda: self._sb.fork(n, labels=labels, ephemeral=False))
        return [
            BerthSandbox(sandbox=sb, timeout=self._timeout, max_output_bytes=self._max_output, auto_start=self._auto_start) for sb in copies
        ]

    async def afork(
        self, n: int = 1, *, labels: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None
    ) -> list[BerthSandbox]:
        return await asyncio.to_thread(lambda: self.fork(n, labels=labels))

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` with ``/bin/sh -c``; a timeout returns exit code 124 and a message."""
        effective = timeout if timeout is not None else self._timeout
        if effective <= 0:
            msg = f"timeout must be positive, got {effective}"
            raise ValueError(msg)
        try:
            r = self._call(lambda: self._sb.exec(command, timeout=effective, max_output_bytes=self._max_output))
        except BerthError as e:
            text = self._model_error(e) or f"{type(e).__name__}: {e.message}"
            return ExecuteResponse(output=f"Error executing command: {text}", exit_code=1, truncated=False)
        if r.timed_out:
            if timeout is not None:
                msg = f"Error: Command timed out after {effective} seconds (custom timeout). The command may be stuck or require more time."
            else:
                msg = f"Error: Command timed out after {effective} seconds. For long-running commands, re-run using the timeout parameter."
            return ExecuteResponse(output=msg, exit_code=124, truncated=False)
        return ExecuteResponse(output=r.stdout + r.stderr, exit_code=r.exit_code, truncated=r.stdout_truncated or r.stderr_truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (parents made); one response per file, in order."""
        out: list[FileUploadResponse | None] = [None] * len(files)
        batch: list[tuple[int, str, bytes]] = []
        for i, (path, content) in enumerate(files):
            if not path.startswith("/"):
                out[i] = FileUploadResponse(path=path, error="invalid_path")
            else:
                batch.append((i, path, content))
        if batch:
            try:
                results = self._call(lambda: self._sb.upload_files([(p, c) for _, p, c in batch]))
            except BerthError as e:
                text = self._model_error(e)
                if text is None:
                    raise
                results = [{"error": {"class": "unavailable", "message": text}}] * len(batch)
            for (i, path, _), res in zip(batch, results, strict=True):
                out[i] = FileUploadResponse(path=path, error=_file_error(res.get("error")))
        return [r for r in out if r is not None]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each file; one response per path, in order."""
        out: list[FileDownloadResponse | None] = [None] * len(paths)
        batch: list[tuple[int, str]] = []
        for i, path in enumerate(paths):
            if not path.startswith("/"):
                out[i] = FileDownloadResponse(path=path, content=None, error="invalid_path")
            else:
                batch.append((i, path))
        if batch:
            try:
                results = self._call(lambda: self._sb.download_files([p for _, p in batch]))
            except BerthError as e:
                text = self._model_error(e)
                if text is None:
                    raise
                results = [{"error": {"class": "unavailable", "message": text}}] * len(batch)
            for (i, path), res in zip(batch, results, strict=True):
                err = _file_error(res.get("error"))
                out[i] = FileDownloadResponse(path=path, content=None if err else res.get("content", b""), error=err)
        return [r for r in out if r is not None]

    # The agent tools, one berth call each (two for a binary read).

    def ls(self, path: str) -> LsResult:
        """The entries of a directory, with size and modification time."""
        try:
            res = self._call(lambda: self._sb.ls(path))
        except BerthError as e:
            if (text := self._model_error(e)) is not None:
                return LsResult(entries=None, error=text)
            code = {"file_not_found": "path_not_found", "not_a_file": "not_a_directory"}.get(_code(e), _code(e))
            if isinstance(e, InvalidArgument) and e.reason == "not_directory":
                code = "not_a_directory"
            return LsResult(entries=None, error=f"Path '{path}': {code}")
        entries: list[FileInfo] = [
            {
                "path": posixpath.join(path, ent["name"]),
                "is_dir": ent["type"] == "dir",
                "size": ent["size"],
                "modified_at": ent["modified_at"],
            }
            for ent in res["entries"]
        ]
        return LsResult(entries=entries)

    def _read_binary(self, file_path: str, size: int) -> ReadResult:
        if size > _MAX_BINARY_BYTES:
            return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum preview size of {_MAX_BINARY_BYTES} bytes")
        raw = self._call(lambda: self._download_at_most(file_path, _MAX_BINARY_BYTES))
        if raw is None:  # it grew after the stat: the sandbox's files are its own to change
            return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum preview size of {_MAX_BINARY_BYTES} bytes")
        return ReadResult(file_data=FileData(content=base64.b64encode(raw).decode("ascii"), encoding="base64"))

    def _download_at_most(self, path: str, cap: int) -> bytes | None:
        """The file's bytes, or None as soon as more than ``cap`` arrive (never
        holding more than one chunk past it)."""
        buf = bytearray()
        with contextlib.closing(self._sb.download_stream(path, chunk_size=64 << 10)) as chunks:
            for chunk in chunks:
                buf += chunk
                if len(buf) > cap:
                    return None
        return bytes(buf)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """A page of a text file (as BaseSandbox.read: raw lines, 500 KiB cap),
        or a binary file base64-encoded."""
        offset, limit = normalize_read_bounds(offset, limit)
        try:
            if _get_backend_read_file_type(file_path) != "text":
                fi = self._call(lambda: self._sb.stat(file_path))
                if fi["type"] != "file":
                    return ReadResult(error=f"File '{file_path}': not_a_file")
                if fi["size"] == 0:
                    return ReadResult(file_data=FileData(content=_EMPTY_FILE, encoding="utf-8"))
                return self._read_binary(file_path, fi["size"])
            page = self._call(lambda: self._sb.read(file_path, offset=offset, limit=max(limit, 1), max_line_chars=1 << 24))
            if page["size"] == 0:
                return ReadResult(file_data=FileData(content=_EMPTY_FILE, encoding="utf-8"))
            if page.get("binary"):
                return self._read_binary(file_path, page["size"])
        except BerthError as e:
            return ReadResult(error=self._model_error(e) or f"File '{file_path}': {_code(e)}")
        if limit <= 0:
            return ReadResult(file_data=FileData(content="", encoding="utf-8"), no_lines_requested=True)
        lines, total = page["lines"], page["total_lines"]
        if not lines:
            return ReadResult(error=f"File '{file_path}': Line offset {offset} exceeds file length ({total} lines)")
        parts: list[str] = []
        used, returned, truncated = 0, 0, False
        budget = _MAX_OUTPUT_BYTES - len(_TRUNCATION_MSG.encode())
        for ln in lines:
            piece = ln["text"] if returned == 0 else "\n" + ln["text"]
            size = len(piece.encode())
            if used + size > budget:
                truncated = True
                prefix = piece.encode()[: budget - used].decode("utf-8", errors="ignore")
                if prefix:
                    parts.append(prefix)
                break
            parts.append(piece)
            used += size
            returned += 1
        text = "".join(parts) + (_TRUNCATION_MSG if truncated else "")
        returned = max(returned, 1)
        end = offset + returned
        return ReadResult(
            file_data=FileData(content=text, encoding="utf-8"),
            total_lines=total,
            start_line=offset + 1,
            end_line=end,
            next_offset=end if end < total else None,
        )

    def write(self, file_path: str, content: str) -> WriteResult:
        """Write a text file, making parents and replacing an existing file."""
        try:
            self._call(lambda: self._sb.write(file_path, content))
        except PermissionDenied as e:
            root = self._artifact_dir(file_path)
            if root is None:
                return WriteResult(error=f"Failed to write file '{file_path}': {_file_error(_as_dict(e))}")
            try:
                self._make_artifact_dir(root)
                self._sb.write(file_path, content)
            except BerthError as e2:
                return WriteResult(error=self._model_error(e2) or f"Failed to write file '{file_path}': {_file_error(_as_dict(e2))}")
        except BerthError as e:
            return WriteResult(error=self._model_error(e) or f"Failed to write file '{file_path}': {_file_error(_as_dict(e))}")
        return WriteResult(path=file_path)

    def _artifact_dir(self, path: str) -> str | None:
        """The deepagents artifact directory ``path`` is in, if it is in one
        not yet made here."""
        norm = posixpath.normpath(path)
        for d in ARTIFACT_DIRS:
            if norm.startswith(d + "/") and d not in self._artifacts_made:
                return d
        return None

    def _make_artifact_dir(self, d: str) -> None:
        """Make ``d`` (at the root, where the sandbox's user may not write) as
        root, owned by that user, so that deepagents can keep its files there."""
        owner = str(self._sb.info.raw.get("user") or "user")
        # A link there (made by root in the sandbox, or shipped in an image)
        # is refused, and chown -h never follows one: root would otherwise
        # give the link's target (/etc) to the sandbox's user.
        script = '[ -L "$1" ] && { echo "$1 is a symbolic link" >&2; exit 1; }; mkdir -p -- "$1" && chown -h -- "$2" "$1"'
        r = self._sb.exec(["/bin/sh", "-c", script, "sh", d, owner], user="root", timeout=30)
        if not r.ok:
            raise PermissionDenied(f"making {d} for {owner}: {r.stderr.strip() or r.exit_code}")
        self._artifacts_made.add(d)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        """Replace an exact string (CRLF files too), as BaseSandbox.edit reports it."""
        if not old_string:
            from deepagents.backends.utils import EMPTY_OLD_STRING_ERROR

            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        try:
            n = self._call(lambda: self._sb.edit(file_path, old_string, new_string, replace_all=replace_all))
        except BerthError as e:
            if (text := self._model_error(e)) is not None:
                return EditResult(error=text)
            messages = {
                "file_not_found": f"Error: File '{file_path}' not found",
                "permission_denied": f"Error: Permission denied editing file '{file_path}'",
                "not_a_file": f"Error: '{file_path}' is not a regular file",
            }
            if e.reason == "no_match":
                return EditResult(error=f"Error: String not found in file: '{old_string}'")
            if e.reason == "not_unique":
                return EditResult(
                    error=f"Error: String '{old_string}' appears multiple times. Use replace_all=True to replace all occurrences."
                )
            code = _code(e)
            return EditResult(error=messages.get(code, f"Error editing file '{file_path}': {code}"))
        return EditResult(path=file_path, occurrences=n)

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        """Lines of text files containing ``pattern`` (literal), skipping
        ``grep_exclude_dirs`` below the searched directory."""
        try:
            res = self._call(lambda: self._sb.grep(pattern, path, glob=glob, limit=max_count + 1 if max_count is not None else 100_000))
        except BerthError as e:
            if (text := self._model_error(e)) is not None:
                return GrepResult(error=text)
            detail = "No such file or directory" if isinstance(e, NotFound) else e.message
            return GrepResult(error=f"Path '{path or '.'}': {detail}")
        root = (path or "").rstrip("/") + "/"
        skip = tuple(f"/{d}/" for d in self.grep_exclude_dirs)
        matches: list[GrepMatch] = [
            {"path": m["path"], "line": m["line"], "text": m["text"]}
            for m in res["matches"]
            if not any(x in "/" + m["path"][len(root) :] for x in skip)
        ]
        if max_count is not None and len(matches) > max_count:
            return GrepResult(matches=matches[:max_count], truncated=True)
        return GrepResult(matches=matches, truncated=bool(res.get("truncated")) and max_count is None)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Files matching ``pattern`` (deepagents' glob contract), absolute paths."""
        root = path if path and path.startswith("/") else "/" + (path or "")
        try:
            res = self._call(lambda: self._sb.glob(pattern, root, limit=100_000))
        except BerthError as e:
            if (text := self._model_error(e)) is not None:
                return GlobResult(matches=None, error=text)
            return GlobResult(matches=None, error=f"Path '{root}': {_code(e) if not isinstance(e, InvalidArgument) else e.message}")
        infos: list[FileInfo] = [
            {"path": m["path"], "is_dir": m["type"] == "dir", "size": m["size"], "modified_at": m["modified_at"]} for m in res["matches"]
        ]
        truncated = bool(res.get("truncated"))
        return GlobResult(matches=infos, truncated=truncated, truncation_reason="budget" if truncated else None)

    # BaseSandbox's async versions run scripts through aexecute; these run
    # the native calls above in a worker thread instead.

    async def als(self, path: str) -> LsResult:
        return await asyncio.to_thread(self.ls, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await asyncio.to_thread(self.read, file_path, offset, limit)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await asyncio.to_thread(self.write, file_path, content)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        return await asyncio.to_thread(self.edit, file_path, old_string, new_string, replace_all)

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        return await asyncio.to_thread(lambda: self.grep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await asyncio.to_thread(self.glob, pattern, path)


_BACKEND_OPTIONS = ("timeout", "max_output_bytes", "auto_start")


class BerthProvider:
    """deepagents-code's sandbox provider for berth: its
    ``deepagents_code.sandbox_providers`` entry point ``berth`` (so
    ``dcode --sandbox berth`` works with berth installed beside it).
    ``get_or_create`` takes :meth:`BerthSandbox.create`'s keywords (the
    config's ``[sandboxes.providers.berth.params]``); the daemon is
    ``$BERTH_URL`` (and ``$BERTH_API_KEY``) unless a client is given."""

    def __init__(self, client: Berth | None = None) -> None:
        self._client = client

    @property
    def client(self) -> Berth:
        if self._client is None:
            self._client = Berth()
        return self._client

    @property
    def metadata(self) -> Any:
        """deepagents-code's description of this provider (None without it)."""
        try:
            from deepagents_code.integrations.sandbox_provider import SandboxProviderMetadata
        except ImportError:
            return None
        return SandboxProviderMetadata(name="berth", working_dir="/home/user", backend_module="berth.deepagents")

    def get_or_create(self, *, sandbox_id: str | None = None, **kwargs: Any) -> BerthSandbox:
        """The backend of sandbox ``sandbox_id`` (started if it was stopped),
        or of a new sandbox made with ``kwargs``."""
        options = {k: kwargs.pop(k) for k in _BACKEND_OPTIONS if k in kwargs}
        if sandbox_id is None:
            return BerthSandbox.create(self.client, **options, **kwargs)
        if kwargs:
            msg = f"sandbox_id {sandbox_id!r} names an existing sandbox: creation options {sorted(kwargs)} do not apply"
            raise InvalidArgument(msg)
        return BerthSandbox(sandbox=self.client.get(sandbox_id), **options)

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:  # noqa: ARG002
        """Delete the sandbox (a sandbox already gone is not an error)."""
        try:
            self.client.delete(sandbox_id)
        except NotFound:
            pass

    async def aget_or_create(self, *, sandbox_id: str | None = None, **kwargs: Any) -> BerthSandbox:
        return await asyncio.to_thread(lambda: self.get_or_create(sandbox_id=sandbox_id, **kwargs))

    async def adelete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        await asyncio.to_thread(lambda: self.delete(sandbox_id=sandbox_id, **kwargs))


def _as_dict(e: BerthError) -> dict[str, Any]:
    return {"class": e.error_class, "reason": e.reason or "", "message": e.message}


__all__ = ["ARTIFACT_DIRS", "DEFAULT_TIMEOUT", "BerthProvider", "BerthSandbox"]
