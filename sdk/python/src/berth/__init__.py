"""berth: self-hosted sandboxes for AI agents.

    from berth import Berth

    with Berth() as client, client.create() as sb:
        print(sb.exec("echo hello").stdout)

The deepagents backend is :class:`berth.deepagents.BerthSandbox`
(install ``berth[deepagents]``).
"""

from ._client import ACCESS_TOKEN_HEADER, DEFAULT_URL, AsyncBerth, AsyncSandbox, Berth, Sandbox
from ._terminal import AsyncTerminal, Terminal
from .errors import (
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
from .types import TTY, ExecEvent, ExecResult, Port, Process, SandboxInfo, TerminalEvent

__version__ = "0.1.0"

__all__ = [
    "ACCESS_TOKEN_HEADER",
    "DEFAULT_URL",
    "AlreadyExists",
    "AsyncBerth",
    "AsyncSandbox",
    "AsyncTerminal",
    "Berth",
    "BerthError",
    "Conflict",
    "DaemonUnreachable",
    "DeadlineExceeded",
    "ExecEvent",
    "ExecResult",
    "InternalError",
    "InvalidArgument",
    "MethodNotAllowed",
    "NotFound",
    "NotImplementedByRuntime",
    "PermissionDenied",
    "Port",
    "Process",
    "ResourceExhausted",
    "Sandbox",
    "SandboxInfo",
    "TTY",
    "Terminal",
    "TerminalEvent",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
]
