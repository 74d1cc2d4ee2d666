"""Typed exceptions that mirror berth's API error classes.

Every API error has a class (``not_found``, ``invalid_argument``, ...) and,
for file operations and ports, sometimes a reason (``is_directory``,
``invalid_path``, ..., ``port_closed``: :class:`Unavailable` from a port
that nothing listens on, and ``merge_conflict``: :class:`Conflict` from an
apply refused because both sides changed the same paths, listed in
``paths``). The SDK raises the subclass of :class:`BerthError` for the
class; ``sandbox_gone``, ``sandbox_stopped`` and ``sandbox_paused`` say the
sandbox itself, not a path, is why a call failed. :func:`error_for` turns an error answer of a port's URL into the
same exception.
"""

from __future__ import annotations

from collections.abc import Sequence

MERGE_CONFLICT = "merge_conflict"
"""The reason of the :class:`Conflict` of an apply that both sides' changes to
the same paths refused (``paths`` lists them; nothing was applied)."""

SANDBOX_GONE = "sandbox_gone"
"""The reason of a :class:`NotFound` about the sandbox itself (it was deleted),
not the path or process a call named."""

SANDBOX_STOPPED = "sandbox_stopped"
"""The reason of a :class:`Conflict` from a call that needs a running sandbox
while it is stopped (or archived): start it and try again."""

SANDBOX_PAUSED = "sandbox_paused"
"""The reason of a :class:`Conflict` from a call to a paused sandbox: resume it
and try again."""


class BerthError(Exception):
    """An error answered by the berth daemon (or the failure to reach it).
    ``paths`` are the paths it is about (an apply's conflicts), else empty."""

    error_class: str = "internal"

    def __init__(
        self, message: str, *, reason: str | None = None, status: int | None = None, paths: Sequence[str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.status = status
        self.paths: list[str] = list(paths or [])


class NotFound(BerthError):
    error_class = "not_found"


class AlreadyExists(BerthError):
    error_class = "already_exists"


class InvalidArgument(BerthError):
    error_class = "invalid_argument"


class Conflict(BerthError):
    error_class = "conflict"


class ResourceExhausted(BerthError):
    error_class = "resource_exhausted"


class PermissionDenied(BerthError):
    error_class = "permission_denied"


class Unauthenticated(BerthError):
    error_class = "unauthenticated"


class Unavailable(BerthError):
    error_class = "unavailable"


class DeadlineExceeded(BerthError):
    error_class = "deadline_exceeded"


class NotImplementedByRuntime(BerthError):
    error_class = "not_implemented"


class InternalError(BerthError):
    error_class = "internal"


class TooLarge(BerthError):
    """A request body over its route's bound (raw uploads have none)."""

    error_class = "too_large"


class MethodNotAllowed(BerthError):
    error_class = "method_not_allowed"


class DaemonUnreachable(Unavailable):
    """The daemon could not be reached at its URL (down, wrong URL, network)."""


_BY_CLASS: dict[str, type[BerthError]] = {
    cls.error_class: cls
    for cls in (
        NotFound,
        AlreadyExists,
        InvalidArgument,
        Conflict,
        ResourceExhausted,
        PermissionDenied,
        Unauthenticated,
        Unavailable,
        DeadlineExceeded,
        NotImplementedByRuntime,
        InternalError,
        TooLarge,
        MethodNotAllowed,
    )
}

_BY_STATUS: dict[int, type[BerthError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: TooLarge,
    429: ResourceExhausted,
    501: NotImplementedByRuntime,
    502: Unavailable,
    503: Unavailable,
    504: DeadlineExceeded,
}


def error_for(status: int, body: object) -> BerthError:
    """Build the exception for an error answer (status and decoded JSON body)."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        cls = _BY_CLASS.get(str(err.get("class")), InternalError)
        reason = err.get("reason")
        paths = err.get("paths")
        return cls(
            err["message"],
            reason=reason if isinstance(reason, str) else None,
            status=status,
            paths=[str(p) for p in paths] if isinstance(paths, list) else None,
        )
    cls = _BY_STATUS.get(status, InternalError)
    return cls(f"HTTP {status}", status=status)


def error_from_class(error_class: str, message: str, reason: str | None = None) -> BerthError:
    """Build the exception for a per-file error of a batch."""
    return _BY_CLASS.get(error_class, InternalError)(message, reason=reason)


__all__ = [
    "MERGE_CONFLICT",
    "SANDBOX_GONE",
    "SANDBOX_PAUSED",
    "SANDBOX_STOPPED",
    "AlreadyExists",
    "BerthError",
    "Conflict",
    "DaemonUnreachable",
    "DeadlineExceeded",
    "InternalError",
    "InvalidArgument",
    "MethodNotAllowed",
    "NotFound",
    "NotImplementedByRuntime",
    "PermissionDenied",
    "ResourceExhausted",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "error_for",
    "error_from_class",
]
