"""Sync and async clients of the berth API.

Each operation is described once, as a :class:`_Call` built by
:class:`_Ops`; :class:`Berth` and :class:`AsyncBerth` (and their sandbox
handles) only send it with a sync or an async ``httpx`` client, or, for an
attachment, open it as a WebSocket (``_terminal``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fnmatch
import io
import json
import math
import os
import tarfile
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, Callable, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import httpx

from ._terminal import AsyncTerminal, Terminal
from .errors import SANDBOX_PAUSED, SANDBOX_STOPPED, BerthError, Conflict, DaemonUnreachable, DeadlineExceeded, InvalidArgument, error_for
from .types import (
    APIKey,
    ApplyResult,
    AuditRecord,
    Diff,
    ExecEvent,
    ExecResult,
    FileInfo,
    GlobResult,
    GrepResult,
    ListResult,
    Port,
    Process,
    Quota,
    ReadResult,
    SandboxInfo,
    Snapshot,
    TenantUsage,
)

DEFAULT_URL = "http://127.0.0.1:7680"
# A request to a sandbox's private port carries its access token as this
# header, as the berth_access_token query parameter (which sets a cookie of
# that name) or as that cookie.
ACCESS_TOKEN_HEADER = "X-Berth-Access-Token"
_ACCESS_TOKEN_QUERY = "berth_access_token"
# The domain of ports in host form when the daemon names none.
_DEFAULT_PORTS_DOMAIN = "berth.localhost"
Body = bytes | IO[bytes] | Iterator[bytes]
# The async client's bodies: an async iterator is streamed as it yields; a
# file or an iterator is read in a worker thread.
AsyncBody = bytes | IO[bytes] | Iterator[bytes] | AsyncIterable[bytes]


def _async_body(data: Any) -> Any:
    """``data`` as httpx's async client sends it: bytes as they are, an async
    iterable as it is, a binary file or a plain iterator read in a thread."""
    if isinstance(data, (bytes, bytearray, memoryview)) or hasattr(data, "__aiter__"):
        return data
    if hasattr(data, "read"):
        return _read_in_thread(lambda: data.read(1 << 20) or None)
    it = iter(data)
    return _read_in_thread(lambda: next(it, None))


async def _read_in_thread(read: Callable[[], bytes | None]) -> AsyncIterator[bytes]:
    """The chunks ``read`` returns, each read in a worker thread, until None."""
    while (chunk := await asyncio.to_thread(read)) is not None:
        if chunk:
            yield chunk


@dataclass
class _Call:
    method: str
    path: str
    # A list of pairs where a name repeats.
    params: dict[str, str] | list[tuple[str, str]] = field(default_factory=dict)
    json: Any = None
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    parse: Callable[[httpx.Response], Any] = lambda r: r.json() if r.content else None
    # Calls that wait on a command wait as long as it runs (the command's own
    # timeout bounds it); others use the client's timeout.
    timeout: Any = httpx.USE_CLIENT_DEFAULT


_WAIT = httpx.Timeout(None, connect=10.0)

# What brings back a sandbox a call found stopped or paused (Sandbox.recover).
_RECOVER = {SANDBOX_STOPPED: "start", SANDBOX_PAUSED: "resume"}


def _sb(id: str, *rest: str) -> str:
    return "/v1/sandboxes/" + quote(id, safe="") + "".join("/" + r for r in rest)


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _where(user: str | None, cwd: str | None) -> dict[str, str]:
    return _drop_none({"user": user, "cwd": cwd})


def _exec_body(
    cmd: Sequence[str] | str,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
    stdin: bytes | str | None,
    timeout: float | None,
    max_output_bytes: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"shell": cmd} if isinstance(cmd, str) else {"cmd": list(cmd)}
    if isinstance(stdin, str):
        stdin = stdin.encode()
    body.update(
        _drop_none(
            {
                "env": dict(env) if env else None,
                "cwd": cwd,
                "user": user,
                "stdin": base64.b64encode(stdin).decode() if stdin else None,
                "timeout_ms": int(timeout * 1000) if timeout else None,
                "max_output_bytes": max_output_bytes,
            }
        )
    )
    return body


def _process_body(cmd: Sequence[str] | str, kw: Mapping[str, Any], tty: tuple[int, int] | None, open_stdin: bool) -> dict[str, Any]:
    body = _exec_body(cmd, **{k: kw.get(k) for k in _EXEC_KW})
    if tty is not None:
        rows, cols = tty
        body["tty"] = {"rows": rows, "cols": cols}
    if open_stdin:
        body["open_stdin"] = True
    return body


def _pty_params(
    cmd: Sequence[str] | str | None, rows: int, cols: int, cwd: str | None, user: str | None, env: Mapping[str, str] | None
) -> list[tuple[str, str]]:
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd or [])
    return [
        ("rows", str(rows)),
        ("cols", str(cols)),
        *(("cmd", a) for a in argv),
        *_where(user, cwd).items(),
        *(("env", f"{k}={v}") for k, v in (env or {}).items()),
    ]


def _limits(memory: int | None, cpus: float | None, pids: int | None, disk: int | None) -> dict[str, Any] | None:
    lim = _drop_none({"memory_bytes": memory, "cpus": cpus, "pids": pids, "disk_bytes": disk})
    return lim or None


def _network(network: str | Mapping[str, Any] | None, allow: Sequence[str] | None) -> dict[str, Any] | None:
    """A network policy from a mode ("open"), a policy dict, or allow (an allowlist)."""
    if network is None and not allow:
        return None
    n: dict[str, Any] = {"mode": network} if isinstance(network, str) else dict(network or {})
    if allow:
        n.setdefault("mode", "allowlist")
        n["allow"] = list(n.get("allow") or []) + list(allow)
    return n


def _create_body(
    labels: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    user: str | None,
    workdir: str | None,
    image: str | Snapshot | None,
    memory: int | None,
    cpus: float | None,
    pids: int | None,
    disk: int | None,
    idle_timeout: float | None,
    delete_after: float | None,
    runtime: str | None = None,
    network: str | Mapping[str, Any] | None = None,
    allow: Sequence[str] | None = None,
    public_ports: Iterable[int] | None = None,
) -> dict[str, Any]:
    timeouts = _drop_none(
        {
            "idle_timeout_s": int(idle_timeout) if idle_timeout is not None else None,
            "delete_after_s": int(delete_after) if delete_after is not None else None,
        }
    )
    return _drop_none(
        {
            "labels": dict(labels) if labels else None,
            "env": dict(env) if env else None,
            "user": user,
            "workdir": workdir,
            "image": image.ref if isinstance(image, Snapshot) else image,
            "runtime": runtime,
            "limits": _limits(memory, cpus, pids, disk),
            "timeouts": timeouts or None,
            "network": _network(network, allow),
            "public_ports": list(public_ports) if public_ports else None,
        }
    )


def _check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument(f"port: {port!r} is not a TCP port (1–65535)")
    return port


def _with_path(prefix: str, path: str, token: str) -> str:
    """prefix/path, the token added to path's query (a fragment stays last)."""
    path, sharp, fragment = path.partition("#")
    path, _, query = path.partition("?")
    if token:
        query = "&".join(q for q in (query, urlencode({_ACCESS_TOKEN_QUERY: token})) if q)
    return prefix + "/" + path.lstrip("/") + ("?" + query if query else "") + sharp + fragment


def _listed(port: int, ports: list[Port]) -> Port | None:
    return next((p for p in ports if p.port == port), None)


def _port_timeout(id: str, port: int, timeout: float, ports: list[Port]) -> DeadlineExceeded:
    others = ", ".join(str(p.port) for p in ports)
    return DeadlineExceeded(
        f"port {port} of sandbox {id}: nothing listens on it after {timeout:g}s"
        + (f" (listening: {others})" if others else "")
    )


def _selector(labels: Mapping[str, str] | None, selector: str | None) -> dict[str, str]:
    """The selector query of a list: labels that must match, and a selector expression."""
    sel = ",".join(f"{k}={v}" for k, v in (labels or {}).items())
    if selector:
        sel = f"{sel},{selector}" if sel else selector
    return {"selector": sel} if sel else {}


# What a fork's copies are labelled with: one set for every copy, or a set per copy in order.
ForkLabels = Mapping[str, str] | Sequence[Mapping[str, str]]


def _fork_body(count: int, labels: ForkLabels | None) -> dict[str, Any]:
    sets: list[dict[str, str]] | None = None
    if isinstance(labels, Mapping):
        sets = [dict(labels) for _ in range(count)] if labels else None
    elif labels is not None:
        sets = [dict(ls) for ls in labels]
    return _drop_none({"count": count, "labels": sets})


def _snapshot_ref(snapshot: str | Snapshot) -> str:
    return snapshot.ref if isinstance(snapshot, Snapshot) else snapshot


def _apply_source(source: Any) -> str:
    """An apply's source as the API names it: a sandbox handle or info by its
    id, a :class:`Snapshot` as ``snapshot:NAME``, a string as given (a sandbox
    id or ``snapshot:NAME``)."""
    if isinstance(source, Snapshot):
        return source.ref
    if isinstance(source, (Sandbox, AsyncSandbox, SandboxInfo)):
        return source.id
    if isinstance(source, str):
        return source
    raise InvalidArgument(f"from: {source!r} is not a sandbox, a sandbox id or a snapshot")


_S = TypeVar("_S")


class Forks(list[_S]):
    """The copies a fork made, as sandbox handles in order, with ``snapshot``
    (the id of the layer they share; "" when the source had changed nothing and
    they were made from its image) and ``frozen_ms`` (how long the source's
    processes were frozen for the capture)."""

    def __init__(self, sandboxes: Iterable[_S], snapshot: str = "", frozen_ms: float = 0.0) -> None:
        super().__init__(sandboxes)
        self.snapshot = snapshot
        self.frozen_ms = frozen_ms


def _key_body(tenant: str | None, scope: str | None, name: str | None, expires_at: datetime | str | None) -> dict[str, Any]:
    if isinstance(expires_at, datetime):
        if expires_at.tzinfo is None:
            raise InvalidArgument(f"expires_at: {expires_at!r} has no time zone (use datetime.now(timezone.utc) + ...)")
        expires_at = expires_at.isoformat()
    return _drop_none({"tenant": tenant, "scope": scope, "name": name, "expires_at": expires_at})


def _key_id(key: str | APIKey) -> str:
    id = key.id if isinstance(key, APIKey) else key
    if not isinstance(id, str) or not id:
        raise InvalidArgument(f"key: {key!r} is not a key id (an APIKey's id, not its secret)")
    return id


def _audit_params(tenant: str | None, sandbox: str | None, after: int, limit: int | None) -> dict[str, str]:
    return _drop_none(
        {
            "tenant": tenant or None,
            "sandbox": sandbox or None,
            "after": str(after) if after else None,
            "limit": str(limit) if limit else None,
        }
    )


def _tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not tenant:
        raise InvalidArgument(f"tenant: {tenant!r} is not a tenant's name (a DNS label)")
    return tenant


def _quota_body(sandboxes: int, cpus: float, memory_bytes: int, disk_bytes: int, snapshot_bytes: int) -> dict[str, Any]:
    """The body of a quota, each bound checked here (a whole number, or for
    cpus any number, not below 0); zero bounds are left out, as none."""
    body: dict[str, Any] = {}
    for name, v in (("sandboxes", sandboxes), ("memory_bytes", memory_bytes), ("disk_bytes", disk_bytes),
                    ("snapshot_bytes", snapshot_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidArgument(f"{name}: {v!r} is not a whole number of 0 (no bound) or more")
        if v:
            body[name] = v
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not math.isfinite(cpus) or cpus < 0:
        raise InvalidArgument(f"cpus: {cpus!r} is not a number of CPUs of 0 (no bound) or more")
    if cpus:
        body["cpus"] = cpus
    return body


class _Ops:
    """Builds the call of every operation."""

    @staticmethod
    def create(body: dict[str, Any]) -> _Call:
        return _Call("POST", "/v1/sandboxes", json=body, parse=lambda r: SandboxInfo.from_json(r.json()))

    @staticmethod
    def get_or_create(body: dict[str, Any]) -> _Call:
        return _Call("POST", "/v1/sandboxes/get-or-create", json=body, parse=lambda r: SandboxInfo.from_json(r.json()))

    @staticmethod
    def runtimes() -> _Call:
        return _Call("GET", "/v1/runtimes", parse=lambda r: r.json()["runtimes"])

    @staticmethod
    def get(id: str) -> _Call:
        return _Call("GET", _sb(id), parse=lambda r: SandboxInfo.from_json(r.json()))

    @staticmethod
    def list(labels: Mapping[str, str] | None, selector: str | None) -> _Call:
        return _Call(
            "GET",
            "/v1/sandboxes",
            params=_selector(labels, selector),
            parse=lambda r: [SandboxInfo.from_json(s) for s in r.json()["sandboxes"]],
        )

    @staticmethod
    def lifecycle(id: str, verb: str) -> _Call:
        return _Call("POST", _sb(id, verb), parse=lambda r: SandboxInfo.from_json(r.json()) if r.content else None)

    @staticmethod
    def pause(id: str, memory: bool) -> _Call:
        return _Call("POST", _sb(id, "pause"), json={"memory": True} if memory else None,
                     parse=lambda r: SandboxInfo.from_json(r.json()), timeout=_WAIT)

    @staticmethod
    def delete(id: str) -> _Call:
        return _Call("DELETE", _sb(id))

    @staticmethod
    def exec(id: str, body: dict[str, Any]) -> _Call:
        return _Call("POST", _sb(id, "exec"), json=body, parse=lambda r: ExecResult.from_json(r.json()), timeout=_WAIT)

    @staticmethod
    def exec_stream(id: str, body: dict[str, Any]) -> _Call:
        return _Call("POST", _sb(id, "exec"), params={"stream": "true"}, json=body, timeout=_WAIT)

    @staticmethod
    def start_process(id: str, body: dict[str, Any]) -> _Call:
        return _Call("POST", _sb(id, "processes"), json=body)

    @staticmethod
    def wait_process(id: str, pid: int, timeout: float | None) -> _Call:
        params = {"timeout_ms": str(int(timeout * 1000))} if timeout else {}
        return _Call(
            "POST", _sb(id, "processes", str(pid), "wait"), params=params, parse=lambda r: ExecResult.from_json(r.json()), timeout=_WAIT
        )

    @staticmethod
    def signal_process(id: str, pid: int, signal: str) -> _Call:
        return _Call("POST", _sb(id, "processes", str(pid), "signal"), json={"signal": signal})

    @staticmethod
    def get_process(id: str, pid: int) -> _Call:
        return _Call("GET", _sb(id, "processes", str(pid)), parse=lambda r: Process.from_json(r.json()))

    @staticmethod
    def list_processes(id: str) -> _Call:
        return _Call("GET", _sb(id, "processes"), parse=lambda r: [Process.from_json(p) for p in r.json()["processes"]])

    @staticmethod
    def write_stdin(id: str, pid: int, data: bytes | str, close: bool) -> _Call:
        return _Call(
            "POST",
            _sb(id, "processes", str(pid), "stdin"),
            params={"close": "true"} if close else {},
            content=data.encode() if isinstance(data, str) else data,
            headers={"Content-Type": "application/octet-stream"},
            # A process that does not read holds the call up.
            timeout=_WAIT,
        )

    # attachments: WebSockets (Terminal, AsyncTerminal)
    @staticmethod
    def attach(id: str, pid: int) -> _Call:
        return _Call("GET", _sb(id, "processes", str(pid), "attach"))

    @staticmethod
    def open_terminal(id: str, params: list[tuple[str, str]]) -> _Call:
        return _Call("GET", _sb(id, "pty"), params=params)

    @staticmethod
    def fs(id: str, op: str, body: dict[str, Any]) -> _Call:
        return _Call("POST", _sb(id, "fs", op), json=body)

    @staticmethod
    def upload(id: str, path: str, data: Any, mode: int | None, user: str | None, create_only: bool) -> _Call:
        params = {"path": path, **_where(user, None)}
        if mode is not None:
            params["mode"] = format(mode, "o")
        if create_only:
            params["create_only"] = "true"
        return _Call("PUT", _sb(id, "files"), params=params, content=data, headers={"Content-Type": "application/octet-stream"})

    @staticmethod
    def download(id: str, path: str, user: str | None) -> _Call:
        return _Call("GET", _sb(id, "files"), params={"path": path, **_where(user, None)}, parse=lambda r: r.content)

    @staticmethod
    def upload_archive(id: str, path: str, data: Any, user: str | None) -> _Call:
        return _Call(
            "PUT", _sb(id, "archive"), params={"path": path, **_where(user, None)}, content=data, headers={"Content-Type": "application/x-tar"}
        )

    @staticmethod
    def download_archive(id: str, path: str, user: str | None) -> _Call:
        return _Call("GET", _sb(id, "archive"), params={"path": path, **_where(user, None)}, parse=lambda r: r.content)

    @staticmethod
    def set_network(id: str, network: dict[str, Any]) -> _Call:
        return _Call("PATCH", _sb(id), json={"network": network}, parse=lambda r: SandboxInfo.from_json(r.json()))

    @staticmethod
    def egress(id: str, after: int, limit: int | None, denied: bool, follow: bool = False) -> _Call:
        params = _drop_none({"after": str(after) if after else None, "limit": str(limit) if limit else None})
        if denied:
            params["denied"] = "true"
        if follow:
            params["follow"] = "true"
            return _Call("GET", _sb(id, "egress"), params=params, timeout=_WAIT)
        return _Call("GET", _sb(id, "egress"), params=params, parse=lambda r: r.json()["records"])

    # snapshots, forks, diff and apply: a capture or a merge copies files, so
    # these wait as long as it takes
    @staticmethod
    def create_snapshot(id: str, name: str, labels: Mapping[str, str] | None) -> _Call:
        body = _drop_none({"name": name, "labels": dict(labels) if labels else None})
        return _Call("POST", _sb(id, "snapshots"), json=body, parse=lambda r: Snapshot.from_json(r.json()), timeout=_WAIT)

    @staticmethod
    def list_snapshots(labels: Mapping[str, str] | None, selector: str | None) -> _Call:
        return _Call(
            "GET",
            "/v1/snapshots",
            params=_selector(labels, selector),
            parse=lambda r: [Snapshot.from_json(s) for s in r.json()["snapshots"]],
        )

    @staticmethod
    def get_snapshot(name: str) -> _Call:
        return _Call("GET", "/v1/snapshots/" + quote(name, safe=""), parse=lambda r: Snapshot.from_json(r.json()))

    @staticmethod
    def delete_snapshot(name: str) -> _Call:
        return _Call("DELETE", "/v1/snapshots/" + quote(name, safe=""), timeout=_WAIT)

    @staticmethod
    def fork(id: str, count: int, labels: ForkLabels | None) -> _Call:
        return _Call("POST", _sb(id, "fork"), json=_fork_body(count, labels), timeout=_WAIT)

    @staticmethod
    def diff(id: str, against: str | Snapshot | None, fmt: str) -> _Call:
        params = {"format": fmt}
        if against:
            params["against"] = _snapshot_ref(against)
        parse: Callable[[httpx.Response], Any] = {
            "json": lambda r: Diff.from_json(r.json()),
            "tar": lambda r: r.content,
            "patch": lambda r: r.text,
        }[fmt]
        return _Call("GET", _sb(id, "diff"), params=params, parse=parse, timeout=_WAIT)

    @staticmethod
    def apply(id: str, source: Any, overwrite: bool) -> _Call:
        body: dict[str, Any] = {"from": _apply_source(source)}
        if overwrite:
            body["overwrite"] = True
        return _Call("POST", _sb(id, "apply"), json=body, parse=lambda r: ApplyResult.from_json(r.json()), timeout=_WAIT)

    @staticmethod
    def apply_tar(id: str, tar: Any) -> _Call:
        return _Call(
            "POST",
            _sb(id, "apply"),
            content=tar,
            headers={"Content-Type": "application/x-tar"},
            parse=lambda r: ApplyResult.from_json(r.json()),
            timeout=_WAIT,
        )

    @staticmethod
    def version() -> _Call:
        return _Call("GET", "/v1/version")

    @staticmethod
    def ports(id: str) -> _Call:
        return _Call("GET", _sb(id, "ports"), parse=lambda r: [Port.from_json(p) for p in r.json()["ports"]])

    @staticmethod
    def rotate_access_token(id: str) -> _Call:
        return _Call("POST", _sb(id, "access-token"), parse=lambda r: r.json()["access_token"])

    @staticmethod
    def set_public_ports(id: str, ports: Iterable[int]) -> _Call:
        return _Call("PATCH", _sb(id), json={"public_ports": list(ports)}, parse=lambda r: SandboxInfo.from_json(r.json()))

    @staticmethod
    def create_secret(name: str, value: str) -> _Call:
        return _Call("POST", "/v1/secrets", json={"name": name, "value": value})

    @staticmethod
    def update_secret(name: str, value: str) -> _Call:
        return _Call("PUT", "/v1/secrets/" + quote(name, safe=""), json={"value": value})

    @staticmethod
    def list_secrets() -> _Call:
        return _Call("GET", "/v1/secrets", parse=lambda r: r.json()["secrets"])

    @staticmethod
    def delete_secret(name: str) -> _Call:
        return _Call("DELETE", "/v1/secrets/" + quote(name, safe=""))

    @staticmethod
    def pull_image(ref: str) -> _Call:
        return _Call("POST", "/v1/images/pull", json={"ref": ref}, timeout=None)

    @staticmethod
    def import_image(data: Any, name: str | None) -> _Call:
        return _Call("POST", "/v1/images/import", params={"name": name} if name else {}, content=data,
                     headers={"Content-Type": "application/x-tar"}, timeout=None, parse=lambda r: r.json()["images"])

    @staticmethod
    def list_images() -> _Call:
        return _Call("GET", "/v1/images", parse=lambda r: r.json()["images"])

    @staticmethod
    def inspect_image(ref: str) -> _Call:
        return _Call("GET", "/v1/images/" + quote(ref, safe="/:@"))

    @staticmethod
    def remove_image(ref: str) -> _Call:
        return _Call("DELETE", "/v1/images/" + quote(ref, safe="/:@"))

    @staticmethod
    def build_template(name: str, context: bytes, dockerfile: str, args: Mapping[str, str] | None, no_cache: bool,
                       network: str | None) -> _Call:
        params: list[tuple[str, str]] = [("name", name), ("dockerfile", dockerfile)]
        params += [("arg", f"{k}={v}") for k, v in (args or {}).items()]
        if no_cache:
            params.append(("no_cache", "true"))
        if network:
            params.append(("network", network))
        return _Call("POST", "/v1/templates/build", params=params, content=context,
                     headers={"Content-Type": "application/x-tar"}, timeout=None)

    @staticmethod
    def list_templates() -> _Call:
        return _Call("GET", "/v1/templates", parse=lambda r: r.json()["images"])

    # API keys and the audit log (client/keys.go)
    @staticmethod
    def create_api_key(body: dict[str, Any]) -> _Call:
        return _Call("POST", "/v1/keys", json=body, parse=lambda r: APIKey.from_json(r.json()))

    @staticmethod
    def list_api_keys() -> _Call:
        return _Call("GET", "/v1/keys", parse=lambda r: [APIKey.from_json(k) for k in r.json()["keys"]])

    @staticmethod
    def revoke_api_key(id: str) -> _Call:
        return _Call("DELETE", "/v1/keys/" + quote(id, safe=""), parse=lambda r: APIKey.from_json(r.json()))

    @staticmethod
    def audit(params: dict[str, str]) -> _Call:
        return _Call("GET", "/v1/audit", params=params, parse=lambda r: [AuditRecord.from_json(a) for a in r.json()["records"]])

    # Quotas and usage (client/keys.go)
    @staticmethod
    def set_quota(tenant: str, body: dict[str, Any]) -> _Call:
        return _Call("PUT", "/v1/tenants/" + quote(tenant, safe="") + "/quota", json=body,
                     parse=lambda r: TenantUsage.from_json(r.json()))

    @staticmethod
    def usage(tenant: str | None) -> _Call:
        return _Call("GET", "/v1/usage", params=_drop_none({"tenant": tenant}),
                     parse=lambda r: [TenantUsage.from_json(u) for u in r.json()["tenants"]])

    @staticmethod
    def set_pool(image: str, size: int) -> _Call:
        return _Call("PUT", "/v1/pools", json={"image": image, "size": size})

    @staticmethod
    def pools() -> _Call:
        return _Call("GET", "/v1/pools", parse=lambda r: r.json()["pools"])


def _context_tar(context: str | os.PathLike[str] | bytes, dockerfile: str) -> bytes:
    """A build context as a tar: bytes as given; a directory's files,
    directories and symlinks (never followed), less what its .dockerignore
    leaves out (fnmatch patterns, "!" exceptions; the Dockerfile always goes)."""
    if isinstance(context, (bytes, bytearray)):
        return bytes(context)
    root = os.fspath(context)
    patterns: list[tuple[bool, str]] = []
    ignore = os.path.join(root, ".dockerignore")
    if os.path.exists(ignore):
        with open(ignore, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    keep = line.startswith("!")
                    patterns.append((keep, os.path.normpath(line.lstrip("!").lstrip("/"))))

    def ignored(rel: str) -> bool:
        if rel == dockerfile:
            return False
        out = False
        parts = rel.split("/")
        for keep, pat in patterns:
            if any(fnmatch.fnmatchcase("/".join(parts[: i + 1]), pat) for i in range(len(parts))):
                out = not keep
        return out

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in dirnames + sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                if ignored(rel):
                    continue
                info = tf.gettarinfo(full, arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isreg():
                    with open(full, "rb") as f:
                        tf.addfile(info, f)
                elif info.isdir() or info.issym():
                    tf.addfile(info)
    return buf.getvalue()


def _base_url(url: str | None) -> tuple[str, httpx.BaseTransport | None, httpx.AsyncBaseTransport | None]:
    url = url or os.environ.get("BERTH_URL") or DEFAULT_URL
    if url.startswith("unix://"):
        sock = url[len("unix://") :]
        return "http://berth", httpx.HTTPTransport(uds=sock), httpx.AsyncHTTPTransport(uds=sock)
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/"), None, None


def _socket_path(url: str) -> str | None:
    return url[len("unix://") :] if url.startswith("unix://") else None


def _headers(api_key: str | None) -> dict[str, str]:
    key = api_key or os.environ.get("BERTH_API_KEY")
    h = {"User-Agent": "berth-python/0.1.0", "Accept-Encoding": "identity"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h


def _check(r: httpx.Response) -> httpx.Response:
    if r.status_code // 100 == 2:
        return r
    try:
        body = r.json()
    except ValueError:
        body = None
    raise error_for(r.status_code, body)


def _ndjson(lines: Iterator[str]) -> Iterator[ExecEvent]:
    for line in lines:
        if line.strip():
            yield ExecEvent.from_json(json.loads(line))


class _FileMixin:
    """File tools shared by both sandbox handles: each builds its call."""

    id: str

    def _fs(self, op: str, body: dict[str, Any], parse: Callable[[Any], Any] | None = None) -> _Call:
        """The call of file tool ``op``; ``parse`` turns its JSON answer into the result."""
        call = _Ops.fs(self.id, op, _drop_none(body))
        if parse is not None:
            call.parse = lambda r: parse(r.json())
        return call

    def _upload_files(self, files: Sequence[tuple[str, bytes]], user: str | None) -> _Call:
        body = {"files": [{"path": p, "content": base64.b64encode(c).decode()} for p, c in files], "user": user}
        return self._fs("upload", body, lambda j: j["results"])

    def _download_files(self, paths: Sequence[str], user: str | None) -> _Call:
        return self._fs("download", {"paths": list(paths), "user": user}, lambda j: [_decode_content(r) for r in j["results"]])

    def _exists(self, path: str, w: Mapping[str, Any]) -> _Call:
        return self._fs("exists", {"path": path, **w}, lambda j: bool(j["exists"]))

    def _list(self, path: str, depth: int | None, w: Mapping[str, Any]) -> _Call:
        return self._fs("list", {"path": path, "depth": depth, **w})

    def _mkdir(self, path: str, parents: bool, mode: int | None, w: Mapping[str, Any]) -> _Call:
        return self._fs("mkdir", {"path": path, "parents": parents, "mode": mode, **w})

    def _move(self, src: str, dst: str, overwrite: bool, w: Mapping[str, Any]) -> _Call:
        return self._fs("move", {"from": src, "to": dst, "overwrite": overwrite, **w})

    def _remove(self, path: str, recursive: bool, force: bool, w: Mapping[str, Any]) -> _Call:
        return self._fs("remove", {"path": path, "recursive": recursive, "force": force, **w})

    def _read(self, path: str, offset: int, limit: int | None, w: Mapping[str, Any]) -> _Call:
        return self._fs("read", {"path": path, "offset": offset, "limit": limit, **w})

    def _write(self, path: str, content: str, create_only: bool, w: Mapping[str, Any]) -> _Call:
        return self._fs("write", {"path": path, "content": content, "create_only": create_only, **w})

    def _edit(self, path: str, old: str, new: str, replace_all: bool, w: Mapping[str, Any]) -> _Call:
        body = {"path": path, "old": old, "new": new, "replace_all": replace_all, **w}
        return self._fs("edit", body, lambda j: int(j["occurrences"]))

    def _glob(self, pattern: str, path: str | None, limit: int | None, w: Mapping[str, Any]) -> _Call:
        return self._fs("glob", {"pattern": pattern, "path": path, "limit": limit, **w})

    def _grep(
        self, pattern: str, path: str | None, glob: str | None, regex: bool, ignore_case: bool, limit: int | None, w: Mapping[str, Any]
    ) -> _Call:
        body = {"pattern": pattern, "path": path, "glob": glob, "regex": regex, "ignore_case": ignore_case, "limit": limit, **w}
        return self._fs("grep", body)


class _PortsMixin:
    """Port addresses shared by both sandbox handles."""

    id: str
    info: SandboxInfo
    _c: Berth | AsyncBerth

    @property
    def access_token(self) -> str:
        """The token that opens the sandbox's private ports (as of the last
        create, get, refresh or :meth:`rotate_access_token`)."""
        return self.info.access_token

    @property
    def public_ports(self) -> list[int]:
        """The ports served without the access token."""
        return list(self.info.public_ports)

    def _check_url(self, port: int) -> None:
        _check_port(port)
        if self._c._unix:
            raise InvalidArgument(
                f"the daemon at {self._c.url} listens on a unix socket: a port has no URL there (berth port-forward)"
            )

    def _port_url(self, port: int, path: str, with_token: bool, domain: str | None) -> str:
        token = self.info.access_token if with_token and port not in self.info.public_ports else ""
        if domain is None:
            return _with_path(self._c._origin + _sb(self.id, "ports", str(port)), path, token)
        u = urlsplit(self._c._origin)
        host = f"{port}-{self.id}.{domain}" + (f":{u.port}" if u.port else "")
        return _with_path(f"{u.scheme}://{host}", path, token)

    def _rotated(self, token: str) -> str:
        self.info.access_token = token
        self.info.raw["access_token"] = token
        return token


class Sandbox(_FileMixin, _PortsMixin):
    """A handle on one sandbox, from :class:`Berth`.

    Used as a context manager, it deletes the sandbox on exit if
    ``ephemeral`` (the default for sandboxes made by :meth:`Berth.create`).
    """

    def __init__(self, client: Berth, info: SandboxInfo, *, ephemeral: bool = False) -> None:
        self._c = client
        self.info = info
        self.id = info.id
        self.ephemeral = ephemeral

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.info.state!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ephemeral:
            self.delete()

    # lifecycle
    def refresh(self) -> SandboxInfo:
        self.info = self._c._send(_Ops.get(self.id))
        return self.info

    def stop(self) -> SandboxInfo:
        self.info = self._c._send(_Ops.lifecycle(self.id, "stop"))
        return self.info

    def start(self) -> SandboxInfo:
        self.info = self._c._send(_Ops.lifecycle(self.id, "start"))
        return self.info

    def delete(self) -> None:
        self._c.delete(self.id)

    def pause(self, *, memory: bool = False) -> SandboxInfo:
        """Freeze the sandbox's processes (state ``paused``): memory, files and
        connections stay, no CPU is used. Exec, process, file and apply calls
        raise :class:`Conflict` until :meth:`resume`; stop, delete, snapshot and
        fork work. A paused sandbox stays so; a stopped one is a :class:`Conflict`.
        With ``memory=True`` (a runtime with ``memory_checkpoint``: gvisor) the
        processes are saved with their memory and the sandbox's CPU and memory
        freed (``info.raw["checkpointed"]``); :meth:`resume` brings them back, same
        pids. Other runtimes raise :class:`NotImplementedByRuntime`."""
        self.info = self._c._send(_Ops.pause(self.id, memory))
        return self.info

    def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox: its processes go on where they were (a running one stays so)."""
        self.info = self._c._send(_Ops.lifecycle(self.id, "resume"))
        return self.info

    def recover(self, error: BerthError) -> bool:
        """If ``error`` is the daemon refusing a call, before it ran, because the
        sandbox was stopped (``sandbox_stopped``) or paused (``sandbox_paused``),
        start or resume it and return True: the call may then be made again.
        Else False (a conflict without that reason may have run: never retry it)."""
        verb = _RECOVER.get(error.reason or "")
        if verb is None:
            return False
        try:
            self.info = self._c._send(_Ops.lifecycle(self.id, verb))
        except Conflict:
            pass  # started or resumed by another caller meanwhile
        return True

    # snapshots, forks, diff and apply
    def snapshot(self, name: str, *, labels: Mapping[str, str] | None = None) -> Snapshot:
        """Capture the sandbox's files as snapshot ``name`` (a running sandbox keeps
        running, frozen for an instant: ``frozen_ms``). Sandboxes are made from it
        with ``create(image=snap.ref)`` (``"snapshot:NAME"``). :class:`AlreadyExists`
        if the name is taken."""
        return self._c._send(_Ops.create_snapshot(self.id, name, labels))

    def fork(self, count: int = 1, *, labels: ForkLabels | None = None, ephemeral: bool = True) -> Forks[Sandbox]:
        """Make ``count`` running copies of the sandbox's files as they are now, and
        return their handles. Each has the source's settings but none of its
        processes, and not its labels: ``labels`` (one mapping for every copy, or a
        list with one per copy) and ``berth.fork_of=<this id>``. As :meth:`Berth.create`'s,
        each handle deletes its copy on leaving a ``with`` block unless ``ephemeral=False``."""
        res = self._c._send(_Ops.fork(self.id, count, labels))
        return Forks(
            (Sandbox(self._c, SandboxInfo.from_json(s), ephemeral=ephemeral) for s in res["sandboxes"]),
            str(res.get("snapshot") or ""),
            float(res.get("frozen_ms") or 0),
        )

    def diff(self, against: str | Snapshot | None = None) -> Diff:
        """What the sandbox changed since its image, or since snapshot ``against``
        (a name, ``snapshot:NAME`` or a :class:`Snapshot`): added, modified and
        deleted paths. A running sandbox is read as it is (snapshot first for a still view)."""
        return self._c._send(_Ops.diff(self.id, against, "json"))

    def diff_tar(self, against: str | Snapshot | None = None) -> bytes:
        """The changes as a layer tar: what was added and modified, and a whiteout
        (``.wh.NAME``) for each deletion; :meth:`apply_tar` applies it to another sandbox."""
        return self._c._send(_Ops.diff(self.id, against, "tar"))

    def diff_patch(self, against: str | Snapshot | None = None) -> str:
        """The changes as a unified text diff (binary and large files are named, not shown)."""
        return self._c._send(_Ops.diff(self.id, against, "patch"))

    def apply(self, from_: Sandbox | Snapshot | str, *, overwrite: bool = False) -> ApplyResult:
        """Merge what another sandbox (a handle or an id) or a snapshot (a :class:`Snapshot`
        or ``"snapshot:NAME"``) changed over its own base into this running sandbox.
        If both changed a path differently nothing is applied: :class:`Conflict` with
        ``reason == "merge_conflict"`` and the paths in ``.paths``; with ``overwrite``
        theirs win (listed in the result's ``conflicts``)."""
        return self._c._send(_Ops.apply(self.id, from_, overwrite))

    def apply_tar(self, tar: Body) -> ApplyResult:
        """Apply a layer tar (another sandbox's :meth:`diff_tar`, from this daemon or
        another) as it comes, whiteouts deleting: there is no base, so no conflicts."""
        return self._c._send(_Ops.apply_tar(self.id, tar))

    # exec
    def exec(
        self,
        cmd: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command (argv, or a string for ``/bin/sh -c``) and wait for it."""
        body = _exec_body(cmd, env=env, cwd=cwd, user=user, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes)
        return self._c._send(_Ops.exec(self.id, body))

    def exec_stream(self, cmd: Sequence[str] | str, **kw: Any) -> Iterator[ExecEvent]:
        """Run a command and yield its events as they happen (start, stdout, stderr, exit)."""
        call = _Ops.exec_stream(self.id, _exec_body(cmd, **{k: kw.get(k) for k in _EXEC_KW}))
        with self._c._stream(call) as r:
            yield from _ndjson(r.iter_lines())

    def start_process(
        self, cmd: Sequence[str] | str, *, tty: tuple[int, int] | None = None, open_stdin: bool = False, **kw: Any
    ) -> int:
        """Start a command in the background (keywords as :meth:`exec`); returns its pid.
        ``tty=(rows, cols)`` runs it on a terminal of that size (its output is all
        stdout); ``open_stdin`` keeps its input open (a terminal's always is), for
        :meth:`write_stdin` and :meth:`attach`."""
        info = self._c._send(_Ops.start_process(self.id, _process_body(cmd, kw, tty, open_stdin)))
        return int(info["pid"])

    def get_process(self, pid: int) -> Process:
        return self._c._send(_Ops.get_process(self.id, pid))

    def list_processes(self) -> list[Process]:
        """The processes started through the API, running and ended."""
        return self._c._send(_Ops.list_processes(self.id))

    def wait_process(self, pid: int, timeout: float | None = None) -> ExecResult:
        return self._c._send(_Ops.wait_process(self.id, pid, timeout))

    def kill_process(self, pid: int, signal: str = "KILL") -> None:
        self._c._send(_Ops.signal_process(self.id, pid, signal))

    # terminals and interactive input
    def write_stdin(self, pid: int, data: bytes | str, *, close: bool = False) -> None:
        """Write bytes (a str as UTF-8) to the input of a process started with
        ``open_stdin`` or ``tty`` (at most 16 MiB a call; the call lasts until the process
        has taken them); with ``close`` the input is closed after them (EOF). :class:`Conflict`
        if its input is not open (never was, closed, or it exited)."""
        self._c._send(_Ops.write_stdin(self.id, pid, data, close))

    def open_terminal(
        self,
        cmd: Sequence[str] | str | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Terminal:
        """Start a command (argv, a string for ``/bin/sh -c``; default the user's login
        shell) on a terminal of ``rows`` by ``cols`` and attach to it. The process runs
        until it exits or is killed, attached or not: :meth:`attach` to its ``pid``
        again after :meth:`Terminal.close`."""
        return self._c._terminal(_Ops.open_terminal(self.id, _pty_params(cmd, rows, cols, cwd, user, env)))

    def attach(self, pid: int) -> Terminal:
        """Attach to a running process (a terminal again, a process started with
        ``open_stdin``); what it printed before comes first. :class:`NotFound` for an
        unknown pid."""
        return self._c._terminal(_Ops.attach(self.id, pid))

    # network
    def set_network(self, network: str | Mapping[str, Any] | None = None, *, allow: Sequence[str] | None = None) -> SandboxInfo:
        """Replace the network policy (a mode, a policy dict, or ``allow`` for an
        allowlist); new connections obey it at once."""
        self.info = self._c._send(_Ops.set_network(self.id, _network(network, allow) or {"mode": "none"}))
        return self.info

    def egress(self, *, after: int = 0, limit: int | None = None, denied: bool = False) -> list[dict[str, Any]]:
        """The sandbox's egress records (connections, requests, DNS queries), oldest first."""
        return self._c._send(_Ops.egress(self.id, after, limit, denied))

    def follow_egress(self, *, after: int = 0, denied: bool = False) -> Iterator[dict[str, Any]]:
        """Yield the stored egress records, then new ones as they happen, until the
        sandbox is deleted (or the caller stops iterating)."""
        with self._c._stream(_Ops.egress(self.id, after, None, denied, follow=True)) as r:
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)

    # ports
    def ports(self) -> list[Port]:
        """The TCP ports processes listen on inside the sandbox, sorted by port."""
        return self._c._send(_Ops.ports(self.id))

    def wait_for_port(self, port: int, timeout: float = 30.0) -> Port:
        """Wait until a process inside listens on ``port`` and return it; raises
        :class:`DeadlineExceeded` after ``timeout`` seconds, :class:`Conflict` if
        the sandbox is not running."""
        _check_port(port)
        deadline, delay = time.monotonic() + timeout, 0.02
        while True:
            ports = self.ports()
            found = _listed(port, ports)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise _port_timeout(self.id, port, timeout, ports)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.25)

    def url(self, port: int, path: str = "/", *, host_form: bool = False, with_token: bool = True) -> str:
        """The address of ``port`` inside the sandbox through the daemon:
        ``{daemon}/v1/sandboxes/{id}/ports/{port}/{path}``, or with ``host_form``
        ``http://{port}-{id}.{ports_domain}:{daemon port}/{path}`` (for apps that use
        absolute paths). Unless the port is public or ``with_token`` is false, it
        carries the access token as ``?berth_access_token=`` (the daemon then sets a
        cookie, so a browser can follow the app's links)."""
        self._check_url(port)
        return self._port_url(port, path, with_token, self._c._ports_domain() if host_form else None)

    def rotate_access_token(self) -> str:
        """Give the sandbox a new access token and return it; the old one opens nothing from now on."""
        return self._rotated(self._c._send(_Ops.rotate_access_token(self.id)))

    def set_public_ports(self, ports: Iterable[int]) -> SandboxInfo:
        """Replace the ports served without the access token (``[]`` for none)."""
        self.info = self._c._send(_Ops.set_public_ports(self.id, ports))
        return self.info

    # files
    def upload(self, path: str, data: Body | str, *, mode: int | None = None, user: str | None = None, create_only: bool = False) -> FileInfo:
        """Write bytes (or a str, as UTF-8, or a binary file object) to a file, making parents."""
        if isinstance(data, str):
            data = data.encode()
        return self._c._send(_Ops.upload(self.id, path, data, mode, user, create_only))

    def download(self, path: str, *, user: str | None = None) -> bytes:
        """Read a whole file."""
        return self._c._send(_Ops.download(self.id, path, user))

    def download_stream(self, path: str, *, user: str | None = None, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """A file's bytes as they arrive (for files too large to hold)."""
        with self._c._stream(_Ops.download(self.id, path, user)) as r:
            yield from r.iter_bytes(chunk_size)

    def download_to(self, path: str, local: str | os.PathLike[str], *, user: str | None = None) -> None:
        """Stream a file to a local path."""
        with open(local, "wb") as f:
            for chunk in self.download_stream(path, user=user):
                f.write(chunk)

    def upload_archive(self, path: str, tar: Body, *, user: str | None = None) -> dict[str, Any]:
        """Unpack a tar stream into a directory (made if missing)."""
        return self._c._send(_Ops.upload_archive(self.id, path, tar, user))

    def download_archive(self, path: str, *, user: str | None = None) -> bytes:
        """A file or tree as a tar stream (the tree under its own name)."""
        return self._c._send(_Ops.download_archive(self.id, path, user))

    def download_archive_stream(self, path: str, *, user: str | None = None, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """:meth:`download_archive`'s tar as it arrives (for trees too large to hold)."""
        with self._c._stream(_Ops.download_archive(self.id, path, user)) as r:
            yield from r.iter_bytes(chunk_size)

    def upload_files(self, files: Sequence[tuple[str, bytes]], *, user: str | None = None) -> list[dict[str, Any]]:
        """Write many files; each result has ``path`` and, on failure, ``error``."""
        return self._c._send(self._upload_files(files, user))

    def download_files(self, paths: Sequence[str], *, user: str | None = None) -> list[dict[str, Any]]:
        """Read many files; each result has ``path`` and ``content`` (bytes) or ``error``."""
        return self._c._send(self._download_files(paths, user))

    def stat(self, path: str, **w: Any) -> FileInfo:
        return self._c._send(self._fs("stat", {"path": path, **w}))

    def exists(self, path: str, **w: Any) -> bool:
        return self._c._send(self._exists(path, w))

    def ls(self, path: str, *, depth: int | None = None, **w: Any) -> ListResult:
        return self._c._send(self._list(path, depth, w))

    def mkdir(self, path: str, *, parents: bool = True, mode: int | None = None, **w: Any) -> FileInfo:
        return self._c._send(self._mkdir(path, parents, mode, w))

    def move(self, src: str, dst: str, *, overwrite: bool = False, **w: Any) -> FileInfo:
        return self._c._send(self._move(src, dst, overwrite, w))

    def remove(self, path: str, *, recursive: bool = False, force: bool = False, **w: Any) -> None:
        self._c._send(self._remove(path, recursive, force, w))

    def read(self, path: str, *, offset: int = 0, limit: int | None = None, **w: Any) -> ReadResult:
        """A page of a text file's numbered lines."""
        return self._c._send(self._read(path, offset, limit, w))

    def write(self, path: str, content: str, *, create_only: bool = False, **w: Any) -> FileInfo:
        return self._c._send(self._write(path, content, create_only, w))

    def edit(self, path: str, old: str, new: str, *, replace_all: bool = False, **w: Any) -> int:
        """Replace ``old`` with ``new``; returns the number of occurrences replaced."""
        return self._c._send(self._edit(path, old, new, replace_all, w))

    def glob(self, pattern: str, path: str | None = None, *, limit: int | None = None, **w: Any) -> GlobResult:
        return self._c._send(self._glob(pattern, path, limit, w))

    def grep(
        self,
        pattern: str,
        path: str | None = None,
        *,
        glob: str | None = None,
        regex: bool = False,
        ignore_case: bool = False,
        limit: int | None = None,
        **w: Any,
    ) -> GrepResult:
        return self._c._send(self._grep(pattern, path, glob, regex, ignore_case, limit, w))


_EXEC_KW = ("env", "cwd", "user", "stdin", "timeout", "max_output_bytes")


def _decode_content(r: dict[str, Any]) -> dict[str, Any]:
    if isinstance(r.get("content"), str):
        r["content"] = base64.b64decode(r["content"])
    elif "error" not in r or r.get("error") is None:
        r["content"] = b""
    return r


class Berth:
    """The sync client. ``url`` defaults to ``$BERTH_URL`` or http://127.0.0.1:7680
    (``unix:///path`` for a socket); ``api_key`` to ``$BERTH_API_KEY``."""

    def __init__(self, url: str | None = None, *, api_key: str | None = None, timeout: float = 300.0) -> None:
        base, transport, _ = _base_url(url)
        self.url = url or os.environ.get("BERTH_URL") or DEFAULT_URL
        self._origin, self._unix, self._domain = base, transport is not None, ""
        self._uds = _socket_path(self.url)
        self._http = httpx.Client(base_url=base, transport=transport, headers=_headers(api_key), timeout=timeout)

    def __enter__(self) -> Berth:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> Any:
        try:
            r = self._http.request(
                call.method, call.path, params=call.params, json=call.json, content=call.content, headers=call.headers, timeout=call.timeout
            )
        except httpx.TransportError as e:
            raise DaemonUnreachable(f"berth daemon not reachable at {self.url}: {e}") from e
        return call.parse(_check(r))

    def _stream(self, call: _Call) -> Any:
        return _StreamContext(self, call)

    def _terminal(self, call: _Call) -> Terminal:
        return Terminal._open(self, call.path, call.params)

    def create(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        workdir: str | None = None,
        image: str | None = None,
        memory: int | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        disk: int | None = None,
        idle_timeout: float | None = None,
        delete_after: float | None = None,
        runtime: str | None = None,
        network: str | Mapping[str, Any] | None = None,
        allow: Sequence[str] | None = None,
        public_ports: Iterable[int] | None = None,
        ephemeral: bool = True,
    ) -> Sandbox:
        """Create a sandbox. As a context manager it is deleted on exit unless ``ephemeral=False``.
        ``runtime`` picks the isolation tier (see :meth:`runtimes`; default: the daemon's).
        ``network`` is a mode ("none", "allowlist", "open") or a policy dict (``mode``,
        ``allow``, ``deny``, ``secrets``); ``allow`` alone makes an allowlist.
        ``public_ports`` are ports inside served without the access token (see :meth:`Sandbox.url`)."""
        body = _create_body(
            labels, env, user, workdir, image, memory, cpus, pids, disk, idle_timeout, delete_after, runtime, network, allow,
            public_ports,
        )
        return Sandbox(self, self._send(_Ops.create(body)), ephemeral=ephemeral)

    def get_or_create(self, labels: Mapping[str, str], **kw: Any) -> Sandbox:
        """The sandbox carrying these labels (started if stopped), or a new one: one per conversation."""
        body = _create_body(labels, *(kw.get(k) for k in _CREATE_KW))
        return Sandbox(self, self._send(_Ops.get_or_create(body)), ephemeral=False)

    def get(self, id: str) -> Sandbox:
        return Sandbox(self, self._send(_Ops.get(id)))

    def list(self, labels: Mapping[str, str] | None = None, *, selector: str | None = None) -> list[SandboxInfo]:
        return self._send(_Ops.list(labels, selector))

    def delete(self, id: str) -> None:
        self._send(_Ops.delete(id))

    # snapshots: taken with Sandbox.snapshot, used with create(image="snapshot:NAME")
    def list_snapshots(self, labels: Mapping[str, str] | None = None, *, selector: str | None = None) -> list[Snapshot]:
        """The named snapshots whose labels match (all without ``labels`` or ``selector``)."""
        return self._send(_Ops.list_snapshots(labels, selector))

    def get_snapshot(self, name: str) -> Snapshot:
        """A snapshot by name, ``snapshot:NAME`` or id, with the sandboxes made from it (``in_use``)."""
        return self._send(_Ops.get_snapshot(name))

    def delete_snapshot(self, name: str | Snapshot) -> None:
        """Remove a snapshot; :class:`Conflict` naming them while sandboxes are made from it."""
        self._send(_Ops.delete_snapshot(name.id if isinstance(name, Snapshot) else name))

    def runtimes(self) -> list[dict[str, Any]]:
        """The daemon's runtimes: each available one with what it can do on this host
        (limits, ceilings, stop/start, network modes, …), the others with why they cannot run here."""
        return self._send(_Ops.runtimes())

    def version(self) -> dict[str, Any]:
        """The daemon's version, API version, runtimes and ``ports_domain``."""
        return self._send(_Ops.version())

    def _ports_domain(self) -> str:
        if not self._domain:
            self._domain = self.version().get("ports_domain") or _DEFAULT_PORTS_DOMAIN
        return self._domain

    # secrets: the daemon adds them to sandboxes' requests; no call returns a value
    def create_secret(self, name: str, value: str) -> dict[str, Any]:
        return self._send(_Ops.create_secret(name, value))

    def update_secret(self, name: str, value: str) -> dict[str, Any]:
        return self._send(_Ops.update_secret(name, value))

    def list_secrets(self) -> list[dict[str, Any]]:
        return self._send(_Ops.list_secrets())

    def delete_secret(self, name: str) -> None:
        self._send(_Ops.delete_secret(name))

    # images: pulled from a registry (or imported from a docker save / OCI
    # layout tar); create(image=...) pulls one itself when it is missing
    def pull_image(self, ref: str) -> dict[str, Any]:
        return self._send(_Ops.pull_image(ref))

    def import_image(self, data: bytes, name: str | None = None) -> list[dict[str, Any]]:
        return self._send(_Ops.import_image(data, name))

    def list_images(self) -> list[dict[str, Any]]:
        return self._send(_Ops.list_images())

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return self._send(_Ops.inspect_image(ref))

    def remove_image(self, ref: str) -> dict[str, Any]:
        return self._send(_Ops.remove_image(ref))

    def build_template(self, name: str, context: str | os.PathLike[str] | bytes, dockerfile: str = "Dockerfile",
                       args: Mapping[str, str] | None = None, no_cache: bool = False,
                       network: str | None = None) -> dict[str, Any]:
        """Builds template ``name`` from a Dockerfile: ``context`` is a directory
        (sent as a tar, less what its .dockerignore leaves out) or a tar's bytes.
        Returns ``{"image", "executed", "cached_steps", "log"}``; sandboxes are then
        created with ``image=name``."""
        return self._send(_Ops.build_template(name, _context_tar(context, dockerfile), dockerfile, args, no_cache, network))

    def list_templates(self) -> list[dict[str, Any]]:
        return self._send(_Ops.list_templates())

    def set_pool(self, image: str, size: int) -> dict[str, Any]:
        return self._send(_Ops.set_pool(image, size))

    def pools(self) -> list[dict[str, Any]]:
        return self._send(_Ops.pools())

    # API keys (an admin key's calls) and the audit log
    def create_api_key(
        self,
        tenant: str | None = None,
        *,
        scope: str | None = None,
        name: str | None = None,
        expires_at: datetime | str | None = None,
    ) -> APIKey:
        """Make an API key (an admin key's call): ``scope`` ``read``, ``write``
        (the daemon's default) or ``admin``; read and write keys act for one
        ``tenant`` (a DNS label) and see only its objects, admin keys for the
        operator. The answer's ``key`` is the secret, shown this once; the key
        stops working at ``expires_at`` (an aware datetime or RFC 3339), if set."""
        return self._send(_Ops.create_api_key(_key_body(tenant, scope, name, expires_at)))

    def list_api_keys(self) -> list[APIKey]:
        """Every key, revoked and expired ones too, oldest first, never with its secret."""
        return self._send(_Ops.list_api_keys())

    def revoke_api_key(self, key: str | APIKey) -> APIKey:
        """Stop a key (by id, or an :class:`APIKey`) from working, at once; it stays listed."""
        return self._send(_Ops.revoke_api_key(_key_id(key)))

    def audit(
        self, *, tenant: str | None = None, sandbox: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[AuditRecord]:
        """The audit log of mutating calls, oldest first: the key's tenant's, or
        for the operator every tenant's (or ``tenant``'s); ``sandbox`` for one
        sandbox's calls, ``after`` a ``seq`` for newer ones only, ``limit`` the
        newest that many (default 1000)."""
        return self._send(_Ops.audit(_audit_params(tenant, sandbox, after, limit)))

    # Quotas (an admin key's call) and usage
    def set_quota(
        self,
        tenant: str,
        *,
        sandboxes: int = 0,
        cpus: float = 0,
        memory_bytes: int = 0,
        disk_bytes: int = 0,
        snapshot_bytes: int = 0,
    ) -> TenantUsage:
        """Set ``tenant``'s quota (an admin key's call), replacing the one it
        had: a zero bound is none, so an all-zero quota removes it. A create,
        start or fork that would pass a bound is :class:`ResourceExhausted`
        naming it; a quota below the current use stops nothing that runs.
        Returns the tenant's usage with its new quota."""
        body = _quota_body(sandboxes, cpus, memory_bytes, disk_bytes, snapshot_bytes)
        return self._send(_Ops.set_quota(_tenant(tenant), body))

    def usage(self, tenant: str | None = None) -> list[TenantUsage]:
        """What tenants use now and have used: the key's own tenant's (one
        entry); for the operator every tenant's, or ``tenant``'s."""
        return self._send(_Ops.usage(None if tenant is None else _tenant(tenant)))


_CREATE_KW = (
    "env", "user", "workdir", "image", "memory", "cpus", "pids", "disk", "idle_timeout", "delete_after", "runtime", "network", "allow",
    "public_ports",
)


class _StreamContext:
    def __init__(self, client: Berth, call: _Call) -> None:
        self._c, self._call, self._cm = client, call, None

    def __enter__(self) -> httpx.Response:
        call = self._call
        try:
            self._cm = self._c._http.stream(
                call.method, call.path, params=call.params, json=call.json, headers=call.headers, timeout=call.timeout
            )
            r = self._cm.__enter__()
        except httpx.TransportError as e:
            raise DaemonUnreachable(f"berth daemon not reachable at {self._c.url}: {e}") from e
        if r.status_code // 100 != 2:
            r.read()
            self._cm.__exit__(None, None, None)
            _check(r)
        return r

    def __exit__(self, *exc: Any) -> None:
        if self._cm is not None:
            self._cm.__exit__(*exc)


class AsyncSandbox(_FileMixin, _PortsMixin):
    """A handle on one sandbox, from :class:`AsyncBerth` (``async with`` deletes an ephemeral one)."""

    def __init__(self, client: AsyncBerth, info: SandboxInfo, *, ephemeral: bool = False) -> None:
        self._c = client
        self.info = info
        self.id = info.id
        self.ephemeral = ephemeral

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ephemeral:
            await self.delete()

    async def stop(self) -> SandboxInfo:
        self.info = await self._c._send(_Ops.lifecycle(self.id, "stop"))
        return self.info

    async def start(self) -> SandboxInfo:
        self.info = await self._c._send(_Ops.lifecycle(self.id, "start"))
        return self.info

    async def delete(self) -> None:
        await self._c.delete(self.id)

    async def refresh(self) -> SandboxInfo:
        self.info = await self._c._send(_Ops.get(self.id))
        return self.info

    async def pause(self, *, memory: bool = False) -> SandboxInfo:
        """As :meth:`Sandbox.pause`."""
        self.info = await self._c._send(_Ops.pause(self.id, memory))
        return self.info

    async def resume(self) -> SandboxInfo:
        self.info = await self._c._send(_Ops.lifecycle(self.id, "resume"))
        return self.info

    async def recover(self, error: BerthError) -> bool:
        """As :meth:`Sandbox.recover`."""
        verb = _RECOVER.get(error.reason or "")
        if verb is None:
            return False
        try:
            self.info = await self._c._send(_Ops.lifecycle(self.id, verb))
        except Conflict:
            pass  # started or resumed by another caller meanwhile
        return True

    async def snapshot(self, name: str, *, labels: Mapping[str, str] | None = None) -> Snapshot:
        """As :meth:`Sandbox.snapshot`."""
        return await self._c._send(_Ops.create_snapshot(self.id, name, labels))

    async def fork(self, count: int = 1, *, labels: ForkLabels | None = None, ephemeral: bool = True) -> Forks[AsyncSandbox]:
        """As :meth:`Sandbox.fork`."""
        res = await self._c._send(_Ops.fork(self.id, count, labels))
        return Forks(
            (AsyncSandbox(self._c, SandboxInfo.from_json(s), ephemeral=ephemeral) for s in res["sandboxes"]),
            str(res.get("snapshot") or ""),
            float(res.get("frozen_ms") or 0),
        )

    async def diff(self, against: str | Snapshot | None = None) -> Diff:
        return await self._c._send(_Ops.diff(self.id, against, "json"))

    async def diff_tar(self, against: str | Snapshot | None = None) -> bytes:
        return await self._c._send(_Ops.diff(self.id, against, "tar"))

    async def diff_patch(self, against: str | Snapshot | None = None) -> str:
        return await self._c._send(_Ops.diff(self.id, against, "patch"))

    async def apply(self, from_: AsyncSandbox | Snapshot | str, *, overwrite: bool = False) -> ApplyResult:
        """As :meth:`Sandbox.apply`."""
        return await self._c._send(_Ops.apply(self.id, from_, overwrite))

    async def apply_tar(self, tar: AsyncBody) -> ApplyResult:
        """As :meth:`Sandbox.apply_tar` (bytes, a binary file or an async iterator of bytes)."""
        return await self._c._send(_Ops.apply_tar(self.id, _async_body(tar)))

    async def exec(self, cmd: Sequence[str] | str, **kw: Any) -> ExecResult:
        """Run a command and wait for it (keywords as :meth:`Sandbox.exec`)."""
        return await self._c._send(_Ops.exec(self.id, _exec_body(cmd, **{k: kw.get(k) for k in _EXEC_KW})))

    async def exec_stream(self, cmd: Sequence[str] | str, **kw: Any) -> AsyncIterator[ExecEvent]:
        """As :meth:`Sandbox.exec_stream`: the events as they happen."""
        call = _Ops.exec_stream(self.id, _exec_body(cmd, **{k: kw.get(k) for k in _EXEC_KW}))
        async with self._c._stream(call) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    yield ExecEvent.from_json(json.loads(line))

    async def start_process(
        self, cmd: Sequence[str] | str, *, tty: tuple[int, int] | None = None, open_stdin: bool = False, **kw: Any
    ) -> int:
        """As :meth:`Sandbox.start_process`."""
        info = await self._c._send(_Ops.start_process(self.id, _process_body(cmd, kw, tty, open_stdin)))
        return int(info["pid"])

    async def get_process(self, pid: int) -> Process:
        return await self._c._send(_Ops.get_process(self.id, pid))

    async def list_processes(self) -> list[Process]:
        return await self._c._send(_Ops.list_processes(self.id))

    async def wait_process(self, pid: int, timeout: float | None = None) -> ExecResult:
        return await self._c._send(_Ops.wait_process(self.id, pid, timeout))

    async def kill_process(self, pid: int, signal: str = "KILL") -> None:
        await self._c._send(_Ops.signal_process(self.id, pid, signal))

    async def write_stdin(self, pid: int, data: bytes | str, *, close: bool = False) -> None:
        """As :meth:`Sandbox.write_stdin`."""
        await self._c._send(_Ops.write_stdin(self.id, pid, data, close))

    async def open_terminal(
        self,
        cmd: Sequence[str] | str | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncTerminal:
        """As :meth:`Sandbox.open_terminal`."""
        return await self._c._terminal(_Ops.open_terminal(self.id, _pty_params(cmd, rows, cols, cwd, user, env)))

    async def attach(self, pid: int) -> AsyncTerminal:
        """As :meth:`Sandbox.attach`."""
        return await self._c._terminal(_Ops.attach(self.id, pid))

    async def upload(
        self, path: str, data: AsyncBody | str, *, mode: int | None = None, user: str | None = None, create_only: bool = False
    ) -> FileInfo:
        """As :meth:`Sandbox.upload`; ``data`` may also be an async iterator of bytes (streamed)."""
        if isinstance(data, str):
            data = data.encode()
        return await self._c._send(_Ops.upload(self.id, path, _async_body(data), mode, user, create_only))

    async def download(self, path: str, *, user: str | None = None) -> bytes:
        return await self._c._send(_Ops.download(self.id, path, user))

    async def download_stream(self, path: str, *, user: str | None = None, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """A file's bytes as they arrive (for files too large to hold)."""
        async with self._c._stream(_Ops.download(self.id, path, user)) as r:
            async for chunk in r.aiter_bytes(chunk_size):
                yield chunk

    async def download_to(self, path: str, local: str | os.PathLike[str], *, user: str | None = None) -> None:
        """As :meth:`Sandbox.download_to`: stream a file to a local path."""
        with open(local, "wb") as f:  # noqa: ASYNC230 (local disk writes of streamed chunks)
            async for chunk in self.download_stream(path, user=user):
                f.write(chunk)

    async def upload_archive(self, path: str, tar: AsyncBody, *, user: str | None = None) -> dict[str, Any]:
        """As :meth:`Sandbox.upload_archive`: unpack a tar stream into a directory."""
        return await self._c._send(_Ops.upload_archive(self.id, path, _async_body(tar), user))

    async def download_archive(self, path: str, *, user: str | None = None) -> bytes:
        """As :meth:`Sandbox.download_archive`: a file or tree as a tar stream."""
        return await self._c._send(_Ops.download_archive(self.id, path, user))

    async def download_archive_stream(self, path: str, *, user: str | None = None, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """As :meth:`Sandbox.download_archive_stream`: the tar as it arrives."""
        async with self._c._stream(_Ops.download_archive(self.id, path, user)) as r:
            async for chunk in r.aiter_bytes(chunk_size):
                yield chunk

    async def upload_files(self, files: Sequence[tuple[str, bytes]], *, user: str | None = None) -> list[dict[str, Any]]:
        return await self._c._send(self._upload_files(files, user))

    async def download_files(self, paths: Sequence[str], *, user: str | None = None) -> list[dict[str, Any]]:
        return await self._c._send(self._download_files(paths, user))

    async def fs(self, op: str, **body: Any) -> Any:
        """Any file operation by name (stat, exists, list, mkdir, move, remove, read, write, edit, glob, grep)."""
        return await self._c._send(self._fs(op, body))

    async def stat(self, path: str, **w: Any) -> FileInfo:
        return await self._c._send(self._fs("stat", {"path": path, **w}))

    async def exists(self, path: str, **w: Any) -> bool:
        return await self._c._send(self._exists(path, w))

    async def ls(self, path: str, *, depth: int | None = None, **w: Any) -> ListResult:
        return await self._c._send(self._list(path, depth, w))

    async def mkdir(self, path: str, *, parents: bool = True, mode: int | None = None, **w: Any) -> FileInfo:
        return await self._c._send(self._mkdir(path, parents, mode, w))

    async def move(self, src: str, dst: str, *, overwrite: bool = False, **w: Any) -> FileInfo:
        return await self._c._send(self._move(src, dst, overwrite, w))

    async def remove(self, path: str, *, recursive: bool = False, force: bool = False, **w: Any) -> None:
        await self._c._send(self._remove(path, recursive, force, w))

    async def read(self, path: str, *, offset: int = 0, limit: int | None = None, **w: Any) -> ReadResult:
        """As :meth:`Sandbox.read`: a page of a text file's numbered lines."""
        return await self._c._send(self._read(path, offset, limit, w))

    async def write(self, path: str, content: str, *, create_only: bool = False, **w: Any) -> FileInfo:
        return await self._c._send(self._write(path, content, create_only, w))

    async def edit(self, path: str, old: str, new: str, *, replace_all: bool = False, **w: Any) -> int:
        """As :meth:`Sandbox.edit`: the number of occurrences replaced."""
        return await self._c._send(self._edit(path, old, new, replace_all, w))

    async def glob(self, pattern: str, path: str | None = None, *, limit: int | None = None, **w: Any) -> GlobResult:
        return await self._c._send(self._glob(pattern, path, limit, w))

    async def grep(
        self,
        pattern: str,
        path: str | None = None,
        *,
        glob: str | None = None,
        regex: bool = False,
        ignore_case: bool = False,
        limit: int | None = None,
        **w: Any,
    ) -> GrepResult:
        return await self._c._send(self._grep(pattern, path, glob, regex, ignore_case, limit, w))

    async def set_network(self, network: str | Mapping[str, Any] | None = None, *, allow: Sequence[str] | None = None) -> SandboxInfo:
        self.info = await self._c._send(_Ops.set_network(self.id, _network(network, allow) or {"mode": "none"}))
        return self.info

    async def egress(self, *, after: int = 0, limit: int | None = None, denied: bool = False) -> list[dict[str, Any]]:
        return await self._c._send(_Ops.egress(self.id, after, limit, denied))

    async def follow_egress(self, *, after: int = 0, denied: bool = False) -> AsyncIterator[dict[str, Any]]:
        """As :meth:`Sandbox.follow_egress`: stored records, then new ones as they happen."""
        async with self._c._stream(_Ops.egress(self.id, after, None, denied, follow=True)) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    yield json.loads(line)

    async def ports(self) -> list[Port]:
        return await self._c._send(_Ops.ports(self.id))

    async def wait_for_port(self, port: int, timeout: float = 30.0) -> Port:
        """As :meth:`Sandbox.wait_for_port`."""
        _check_port(port)
        deadline, delay = time.monotonic() + timeout, 0.02
        while True:
            ports = await self.ports()
            found = _listed(port, ports)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise _port_timeout(self.id, port, timeout, ports)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 0.25)

    async def url(self, port: int, path: str = "/", *, host_form: bool = False, with_token: bool = True) -> str:
        """As :meth:`Sandbox.url` (awaited: the host form asks the daemon for its domain once)."""
        self._check_url(port)
        return self._port_url(port, path, with_token, await self._c._ports_domain() if host_form else None)

    async def rotate_access_token(self) -> str:
        return self._rotated(await self._c._send(_Ops.rotate_access_token(self.id)))

    async def set_public_ports(self, ports: Iterable[int]) -> SandboxInfo:
        self.info = await self._c._send(_Ops.set_public_ports(self.id, ports))
        return self.info


class AsyncBerth:
    """The async client (same configuration as :class:`Berth`)."""

    def __init__(self, url: str | None = None, *, api_key: str | None = None, timeout: float = 300.0) -> None:
        base, _, transport = _base_url(url)
        self.url = url or os.environ.get("BERTH_URL") or DEFAULT_URL
        self._origin, self._unix, self._domain = base, transport is not None, ""
        self._uds = _socket_path(self.url)
        self._http = httpx.AsyncClient(base_url=base, transport=transport, headers=_headers(api_key), timeout=timeout)

    async def __aenter__(self) -> AsyncBerth:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> Any:
        try:
            r = await self._http.request(
                call.method, call.path, params=call.params, json=call.json, content=call.content, headers=call.headers, timeout=call.timeout
            )
        except httpx.TransportError as e:
            raise DaemonUnreachable(f"berth daemon not reachable at {self.url}: {e}") from e
        return call.parse(_check(r))

    async def _terminal(self, call: _Call) -> AsyncTerminal:
        return await AsyncTerminal._open(self, call.path, call.params)

    @contextlib.asynccontextmanager
    async def _stream(self, call: _Call) -> AsyncIterator[httpx.Response]:
        """The response to ``call``, its body not yet read; an error answer raises."""
        try:
            cm = self._http.stream(
                call.method, call.path, params=call.params, json=call.json, content=call.content, headers=call.headers, timeout=call.timeout
            )
            r = await cm.__aenter__()
        except httpx.TransportError as e:
            raise DaemonUnreachable(f"berth daemon not reachable at {self.url}: {e}") from e
        try:
            if r.status_code // 100 != 2:
                await r.aread()
                _check(r)
            yield r
        finally:
            await cm.__aexit__(None, None, None)

    async def create(self, *, ephemeral: bool = True, labels: Mapping[str, str] | None = None, **kw: Any) -> AsyncSandbox:
        body = _create_body(labels, *(kw.get(k) for k in _CREATE_KW))
        return AsyncSandbox(self, await self._send(_Ops.create(body)), ephemeral=ephemeral)

    async def get_or_create(self, labels: Mapping[str, str], **kw: Any) -> AsyncSandbox:
        body = _create_body(labels, *(kw.get(k) for k in _CREATE_KW))
        return AsyncSandbox(self, await self._send(_Ops.get_or_create(body)), ephemeral=False)

    async def get(self, id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self._send(_Ops.get(id)))

    async def list(self, labels: Mapping[str, str] | None = None, *, selector: str | None = None) -> list[SandboxInfo]:
        return await self._send(_Ops.list(labels, selector))

    async def delete(self, id: str) -> None:
        await self._send(_Ops.delete(id))

    async def list_snapshots(self, labels: Mapping[str, str] | None = None, *, selector: str | None = None) -> list[Snapshot]:
        return await self._send(_Ops.list_snapshots(labels, selector))

    async def get_snapshot(self, name: str) -> Snapshot:
        return await self._send(_Ops.get_snapshot(name))

    async def delete_snapshot(self, name: str | Snapshot) -> None:
        await self._send(_Ops.delete_snapshot(name.id if isinstance(name, Snapshot) else name))

    async def runtimes(self) -> list[dict[str, Any]]:
        return await self._send(_Ops.runtimes())

    async def version(self) -> dict[str, Any]:
        return await self._send(_Ops.version())

    async def _ports_domain(self) -> str:
        if not self._domain:
            self._domain = (await self.version()).get("ports_domain") or _DEFAULT_PORTS_DOMAIN
        return self._domain

    async def create_secret(self, name: str, value: str) -> dict[str, Any]:
        return await self._send(_Ops.create_secret(name, value))

    async def update_secret(self, name: str, value: str) -> dict[str, Any]:
        return await self._send(_Ops.update_secret(name, value))

    async def list_secrets(self) -> list[dict[str, Any]]:
        return await self._send(_Ops.list_secrets())

    async def delete_secret(self, name: str) -> None:
        await self._send(_Ops.delete_secret(name))

    async def pull_image(self, ref: str) -> dict[str, Any]:
        return await self._send(_Ops.pull_image(ref))

    async def import_image(self, data: bytes, name: str | None = None) -> list[dict[str, Any]]:
        return await self._send(_Ops.import_image(data, name))

    async def list_images(self) -> list[dict[str, Any]]:
        return await self._send(_Ops.list_images())

    async def inspect_image(self, ref: str) -> dict[str, Any]:
        return await self._send(_Ops.inspect_image(ref))

    async def remove_image(self, ref: str) -> dict[str, Any]:
        return await self._send(_Ops.remove_image(ref))

    async def build_template(self, name: str, context: str | os.PathLike[str] | bytes, dockerfile: str = "Dockerfile",
                             args: Mapping[str, str] | None = None, no_cache: bool = False,
                             network: str | None = None) -> dict[str, Any]:
        return await self._send(_Ops.build_template(name, _context_tar(context, dockerfile), dockerfile, args, no_cache, network))

    async def list_templates(self) -> list[dict[str, Any]]:
        return await self._send(_Ops.list_templates())

    async def set_pool(self, image: str, size: int) -> dict[str, Any]:
        return await self._send(_Ops.set_pool(image, size))

    async def pools(self) -> list[dict[str, Any]]:
        return await self._send(_Ops.pools())

    async def create_api_key(
        self,
        tenant: str | None = None,
        *,
        scope: str | None = None,
        name: str | None = None,
        expires_at: datetime | str | None = None,
    ) -> APIKey:
        """As :meth:`Berth.create_api_key`."""
        return await self._send(_Ops.create_api_key(_key_body(tenant, scope, name, expires_at)))

    async def list_api_keys(self) -> list[APIKey]:
        return await self._send(_Ops.list_api_keys())

    async def revoke_api_key(self, key: str | APIKey) -> APIKey:
        return await self._send(_Ops.revoke_api_key(_key_id(key)))

    async def audit(
        self, *, tenant: str | None = None, sandbox: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[AuditRecord]:
        """As :meth:`Berth.audit`."""
        return await self._send(_Ops.audit(_audit_params(tenant, sandbox, after, limit)))

    async def set_quota(
        self,
        tenant: str,
        *,
        sandboxes: int = 0,
        cpus: float = 0,
        memory_bytes: int = 0,
        disk_bytes: int = 0,
        snapshot_bytes: int = 0,
    ) -> TenantUsage:
        """As :meth:`Berth.set_quota`."""
        body = _quota_body(sandboxes, cpus, memory_bytes, disk_bytes, snapshot_bytes)
        return await self._send(_Ops.set_quota(_tenant(tenant), body))

    async def usage(self, tenant: str | None = None) -> list[TenantUsage]:
        """As :meth:`Berth.usage`."""
        return await self._send(_Ops.usage(None if tenant is None else _tenant(tenant)))


__all__ = [
    "ACCESS_TOKEN_HEADER",
    "DEFAULT_URL",
    "AsyncBerth",
    "AsyncSandbox",
    "AsyncTerminal",
    "Berth",
    "BerthError",
    "Forks",
    "Sandbox",
    "Terminal",
]
