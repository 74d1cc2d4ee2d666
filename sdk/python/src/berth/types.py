"""Result types of the berth SDK."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import NotRequired, TypedDict


def _b64(v: Any) -> bytes:
    return base64.b64decode(v) if isinstance(v, str) and v else b""


@dataclass
class ExecResult:
    """How a command ended, with its output."""

    exit_code: int
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    signal: int = 0
    oom_killed: bool = False
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    pid: int = 0
    error: str = ""

    @property
    def stdout(self) -> str:
        """Standard output decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        """Standard error decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExecResult:
        return cls(
            exit_code=int(d.get("exit_code", 0)),
            stdout_bytes=_b64(d.get("stdout")),
            stderr_bytes=_b64(d.get("stderr")),
            signal=int(d.get("signal", 0) or 0),
            oom_killed=bool(d.get("oom_killed")),
            timed_out=bool(d.get("timed_out")),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            duration_ms=int(d.get("duration_ms", 0) or 0),
            pid=int(d.get("pid", 0) or 0),
            error=str(d.get("error", "") or ""),
        )


@dataclass
class ExecEvent:
    """One event of a streamed exec: start, stdout, stderr, exit or error."""

    type: str
    data: bytes = b""
    pid: int = 0
    result: ExecResult | None = None
    error: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExecEvent:
        res = d.get("result")
        return cls(
            type=str(d.get("type", "")),
            data=_b64(d.get("data")),
            pid=int(d.get("pid", 0) or 0),
            result=ExecResult.from_json(res) if isinstance(res, dict) else None,
            error=d.get("error") if isinstance(d.get("error"), dict) else None,
        )


@dataclass
class SandboxInfo:
    """A sandbox as the daemon describes it."""

    id: str
    state: str
    labels: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    # Ports inside served without the access token, sorted.
    public_ports: list[int] = field(default_factory=list)
    # Opens the sandbox's private ports (see Sandbox.url).
    access_token: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxInfo:
        return cls(
            id=d["id"],
            state=d.get("state", ""),
            labels=dict(d.get("labels") or {}),
            raw=d,
            public_ports=[int(p) for p in d.get("public_ports") or []],
            access_token=str(d.get("access_token") or ""),
        )


@dataclass
class Port:
    """A TCP socket listening inside a sandbox."""

    port: int
    address: str = ""
    proto: str = "tcp"
    public: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Port:
        return cls(
            port=int(d["port"]),
            address=str(d.get("address", "")),
            proto=str(d.get("proto", "tcp")),
            public=bool(d.get("public")),
        )


class FileInfo(TypedDict):
    """A file as stat, list and glob describe it."""

    path: str
    name: str
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    owner: NotRequired[str]
    group: NotRequired[str]
    modified_at: str
    target: NotRequired[str]


class Line(TypedDict):
    number: int
    text: str
    truncated: NotRequired[bool]


class ReadResult(TypedDict):
    """A page of a text file: numbered lines, total lines, next offset."""

    path: str
    size: int
    binary: NotRequired[bool]
    lines: list[Line]
    total_lines: int
    next_offset: int


class GrepMatch(TypedDict):
    path: str
    line: int
    text: str


class GrepResult(TypedDict):
    matches: list[GrepMatch]
    truncated: NotRequired[bool]
    files_searched: int


class GlobResult(TypedDict):
    matches: list[FileInfo]
    truncated: NotRequired[bool]


class ListResult(TypedDict):
    entries: list[FileInfo]
    truncated: NotRequired[bool]


class FileResult(TypedDict):
    """One path's outcome in a batch; ``error`` is absent on success."""

    path: str
    content: NotRequired[bytes]
    error: NotRequired[dict[str, str]]


__all__ = [
    "ExecEvent",
    "ExecResult",
    "FileInfo",
    "FileResult",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "Line",
    "ListResult",
    "Port",
    "ReadResult",
    "SandboxInfo",
]
