"""Result types of the berth SDK."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from typing_extensions import NotRequired, TypedDict

from .errors import BerthError


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


class TTY(NamedTuple):
    """A terminal's size in characters; a ``(rows, cols)`` tuple."""

    rows: int
    cols: int

    @classmethod
    def from_json(cls, d: Any) -> TTY | None:
        return cls(int(d["rows"]), int(d["cols"])) if isinstance(d, dict) else None


@dataclass
class Process:
    """A background process as the daemon describes it."""

    pid: int
    cmd: list[str] = field(default_factory=list)
    running: bool = False
    started_at: str = ""
    # How it ended, once it has (wait_process gives its kept output).
    result: ExecResult | None = None
    # The terminal's size, for a process on one.
    tty: TTY | None = None
    # Its input is open for more (write_stdin, an attachment).
    open_stdin: bool = False
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Process:
        res = d.get("result")
        return cls(
            pid=int(d["pid"]),
            cmd=[str(a) for a in d.get("cmd") or []],
            running=bool(d.get("running")),
            started_at=str(d.get("started_at", "")),
            result=ExecResult.from_json(res) if isinstance(res, dict) else None,
            tty=TTY.from_json(d.get("tty")),
            open_stdin=bool(d.get("open_stdin")),
            raw=d,
        )


@dataclass
class TerminalEvent:
    """One event of an attachment (:class:`berth.Terminal`): ``stdout`` (a
    terminal's output, or a process's standard output) or ``stderr`` bytes in
    ``data``; ``error``, what the daemon could not do: a message it could not
    take (the attachment goes on), or what ends the attachment (the sandbox
    went away; ``recv`` raises it next); ``exit``, the last, with ``result``
    (its output is what came in the events before)."""

    type: str
    data: bytes = b""
    result: ExecResult | None = None
    error: BerthError | None = None


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


SNAPSHOT_PREFIX = "snapshot:"
"""Begins an image reference that names a snapshot: ``create(image="snapshot:NAME")``."""


@dataclass
class Snapshot:
    """A sandbox's files at one instant, usable as an image (:attr:`ref`)."""

    id: str
    name: str = ""
    # The sandbox it was taken of (which may be gone since).
    sandbox: str = ""
    # The image that sandbox was made from; base_image_id the stored image
    # under the snapshot's layers ("" for the host image).
    image: str = ""
    base_image_id: str = ""
    # The snapshot that sandbox was made from, if any.
    parent: str = ""
    # What the snapshot's own layer holds: what the sandbox changed.
    size_bytes: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    # How long the sandbox's processes were frozen for the capture.
    frozen_ms: float = 0.0
    created_at: str = ""
    # The sandboxes made from it (get_snapshot only).
    in_use: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        """The image reference that names it: ``snapshot:NAME`` (its id when unnamed)."""
        return SNAPSHOT_PREFIX + (self.name or self.id)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Snapshot:
        return cls(
            id=str(d["id"]),
            name=str(d.get("name") or ""),
            sandbox=str(d.get("sandbox") or ""),
            image=str(d.get("image") or ""),
            base_image_id=str(d.get("base_image_id") or ""),
            parent=str(d.get("parent") or ""),
            size_bytes=int(d.get("size_bytes") or 0),
            labels=dict(d.get("labels") or {}),
            frozen_ms=float(d.get("frozen_ms") or 0),
            created_at=str(d.get("created_at") or ""),
            in_use=[str(s) for s in d.get("in_use") or []],
            raw=d,
        )


@dataclass
class Change:
    """One path a sandbox changed: ``kind`` is added, modified or deleted;
    ``type`` the entry's (the old one's when deleted): file, dir, symlink, …"""

    path: str
    kind: str
    type: str = ""
    # Permission bits with setuid, setgid and sticky.
    mode: int = 0
    size: int = 0
    uid: int = 0
    gid: int = 0
    # A symlink's target.
    link: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Change:
        return cls(
            path=str(d["path"]),
            kind=str(d.get("kind") or ""),
            type=str(d.get("type") or ""),
            mode=int(d.get("mode") or 0),
            size=int(d.get("size") or 0),
            uid=int(d.get("uid") or 0),
            gid=int(d.get("gid") or 0),
            link=str(d.get("link") or ""),
        )


def _changes(v: Any) -> list[Change]:
    return [Change.from_json(c) for c in v or []]


@dataclass
class Diff:
    """What a sandbox changed over ``against``: its image, or ``snapshot:NAME``."""

    against: str
    changes: list[Change] = field(default_factory=list)

    def paths(self, kind: str | None = None) -> list[str]:
        """The changed paths, or those of one kind (added, modified, deleted)."""
        return [c.path for c in self.changes if kind is None or c.kind == kind]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Diff:
        return cls(against=str(d.get("against") or ""), changes=_changes(d.get("changes")))


@dataclass
class ApplyResult:
    """What an apply changed: the changes applied (none listed for a tar,
    applied as it came), the paths both sides changed (theirs won, with
    overwrite), and the entries written, deletions made and bytes written."""

    changes: list[Change] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    entries: int = 0
    whiteouts: int = 0
    bytes: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ApplyResult:
        return cls(
            changes=_changes(d.get("changes")),
            conflicts=[str(p) for p in d.get("conflicts") or []],
            entries=int(d.get("entries") or 0),
            whiteouts=int(d.get("whiteouts") or 0),
            bytes=int(d.get("bytes") or 0),
        )


@dataclass
class APIKey:
    """An API key as the daemon shows it. ``key``, the secret to send as
    ``Berth(api_key=...)``, is set only in the answer to its creation (it is
    stored hashed); it never shows in the key's repr."""

    id: str
    scope: str
    # The tenant that owns what the key creates and is all it sees; "" for
    # an admin key, which acts for the operator.
    tenant: str = ""
    name: str = ""
    created_at: str = ""
    expires_at: str = ""
    revoked_at: str = ""
    key: str = field(default="", repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def revoked(self) -> bool:
        return bool(self.revoked_at)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> APIKey:
        return cls(
            id=str(d["id"]),
            scope=str(d.get("scope") or ""),
            tenant=str(d.get("tenant") or ""),
            name=str(d.get("name") or ""),
            created_at=str(d.get("created_at") or ""),
            expires_at=str(d.get("expires_at") or ""),
            revoked_at=str(d.get("revoked_at") or ""),
            key=str(d.get("key") or ""),
            raw={k: v for k, v in d.items() if k != "key"},
        )


@dataclass
class AuditRecord:
    """One mutating API call in the audit log: who (tenant, key id), what
    (method, route, path, sandbox) and how it ended (status, error class)."""

    seq: int
    at: str
    method: str
    route: str
    path: str
    status: int
    request_id: str = ""
    tenant: str = ""
    key_id: str = ""
    sandbox_id: str = ""
    # The error's class ("permission_denied", ...), "" for a success.
    error: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AuditRecord:
        return cls(
            seq=int(d["seq"]),
            at=str(d.get("at") or ""),
            method=str(d.get("method") or ""),
            route=str(d.get("route") or ""),
            path=str(d.get("path") or ""),
            status=int(d.get("status") or 0),
            request_id=str(d.get("request_id") or ""),
            tenant=str(d.get("tenant") or ""),
            key_id=str(d.get("key_id") or ""),
            sandbox_id=str(d.get("sandbox_id") or ""),
            error=str(d.get("error") or ""),
        )


@dataclass
class Quota:
    """What one tenant may hold; a zero field is no bound. A create (or start,
    or fork) that would pass a bound is :class:`~berth.ResourceExhausted`
    naming it and the current use; a quota below the current use stops
    nothing that runs, it only refuses what would add more."""

    # The most sandboxes running (or paused) at once.
    sandboxes: int = 0
    # The most limits.cpus summed over running sandboxes (a sandbox without
    # a CPU limit is refused while it is set).
    cpus: float = 0.0
    # The most limits.memory_bytes summed over running sandboxes (likewise).
    memory_bytes: int = 0
    # The most limits.disk_bytes summed over all the tenant's sandboxes,
    # stopped ones too (likewise).
    disk_bytes: int = 0
    # The most bytes of snapshots stored.
    snapshot_bytes: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Quota:
        d = d or {}
        return cls(
            sandboxes=int(d.get("sandboxes") or 0),
            cpus=float(d.get("cpus") or 0),
            memory_bytes=int(d.get("memory_bytes") or 0),
            disk_bytes=int(d.get("disk_bytes") or 0),
            snapshot_bytes=int(d.get("snapshot_bytes") or 0),
        )


@dataclass
class TenantUsage:
    """What one tenant uses now, as its ``quota`` counts it, and the counters
    a team bills on (since the tenant's first sandbox, sampled every few
    seconds while sandboxes run). ``tenant`` is "" for the operator's own
    sandboxes."""

    tenant: str
    quota: Quota = field(default_factory=Quota)
    sandboxes: int = 0
    cpus: float = 0.0
    memory_bytes: int = 0
    disk_bytes: int = 0
    snapshot_bytes: int = 0
    sandbox_seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_gb_seconds: float = 0.0
    egress_bytes_out: int = 0
    egress_bytes_in: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TenantUsage:
        return cls(
            tenant=str(d.get("tenant") or ""),
            quota=Quota.from_json(d.get("quota")),
            sandboxes=int(d.get("sandboxes") or 0),
            cpus=float(d.get("cpus") or 0),
            memory_bytes=int(d.get("memory_bytes") or 0),
            disk_bytes=int(d.get("disk_bytes") or 0),
            snapshot_bytes=int(d.get("snapshot_bytes") or 0),
            sandbox_seconds=float(d.get("sandbox_seconds") or 0),
            cpu_seconds=float(d.get("cpu_seconds") or 0),
            memory_gb_seconds=float(d.get("memory_gb_seconds") or 0),
            egress_bytes_out=int(d.get("egress_bytes_out") or 0),
            egress_bytes_in=int(d.get("egress_bytes_in") or 0),
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
    "SNAPSHOT_PREFIX",
    "APIKey",
    "ApplyResult",
    "AuditRecord",
    "Change",
    "Diff",
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
    "Process",
    "Quota",
    "ReadResult",
    "SandboxInfo",
    "Snapshot",
    "TTY",
    "TenantUsage",
    "TerminalEvent",
]
