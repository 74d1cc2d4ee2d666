"""berth: self-hosted sandboxes for AI agents.

    from berth import Berth

    with Berth() as client, client.create() as sb:
        print(sb.exec("echo hello").stdout)

The deepagents backend is :class:`berth.deepagents.BerthSandbox`
(install ``berth[deepagents]``).
"""

from ._client import ACCESS_TOKEN_HEADER, DEFAULT_URL, AsyncBerth, AsyncSandbox, Berth, Forks, Sandbox
from ._terminal import AsyncTerminal, Terminal
from .errors import (
    MERGE_CONFLICT,
    AlreadyExists,
    BerthError,
    Conflict,
    DaemonUnreachable,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    NotImplementedByRuntime,
    PermissionDenied,
    ResourceExhausted,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from .types import (
    SNAPSHOT_PREFIX,
    TTY,
    APIKey,
    ApplyResult,
    AuditRecord,
    Change,
    Diff,
    ExecEvent,
    ExecResult,
    Port,
    Process,
    Quota,
    SandboxInfo,
    Snapshot,
    TenantUsage,
    TerminalEvent,
)

__version__ = "0.1.0"

__all__ = [
    "ACCESS_TOKEN_HEADER",
    "DEFAULT_URL",
    "MERGE_CONFLICT",
    "SNAPSHOT_PREFIX",
    "APIKey",
    "AlreadyExists",
    "ApplyResult",
    "AuditRecord",
    "AsyncBerth",
    "AsyncSandbox",
    "AsyncTerminal",
    "Berth",
    "BerthError",
    "Change",
    "Conflict",
    "DaemonUnreachable",
    "DeadlineExceeded",
    "Diff",
    "ExecEvent",
    "ExecResult",
    "Forks",
    "InternalError",
    "InvalidArgument",
    "MethodNotAllowed",
    "NotFound",
    "NotImplementedByRuntime",
    "PermissionDenied",
    "Port",
    "Process",
    "Quota",
    "ResourceExhausted",
    "Sandbox",
    "SandboxInfo",
    "Snapshot",
    "TTY",
    "TenantUsage",
    "Terminal",
    "TerminalEvent",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
]
