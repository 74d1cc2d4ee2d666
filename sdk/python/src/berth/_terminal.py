"""Attachments to processes over a WebSocket: terminals and interactive input.

The protocol is the daemon's (api/terminals.go): binary messages carry
bytes, the process's input from us and its output (a terminal's, or
stdout) from the daemon; text messages are one JSON TerminalMessage each:
``resize`` and ``eof`` from us, ``attached`` (first), ``stderr``, ``error``
(the attachment goes on) and ``exit`` (last, then a 1000 close) from the
daemon. :class:`Terminal` and :class:`AsyncTerminal` only move the messages;
what they mean is decided once, in :class:`_Attachment`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import websockets.asyncio.client
import websockets.sync.client
from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection

from .errors import (
    BerthError,
    Conflict,
    DaemonUnreachable,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    Unavailable,
    error_for,
    error_from_class,
)
from .types import TTY, ExecResult, TerminalEvent

if TYPE_CHECKING:
    from ._client import AsyncBerth, Berth

# The largest message the daemon sends is a 1 MiB frame of output, as
# base64 in JSON for stderr.
_MAX_MESSAGE = 4 << 20
# The daemon's bound on a terminal's rows and columns.
_MAX_TTY = 10000


@dataclasses.dataclass
class _Dial:
    """Where and how to open an attachment's WebSocket."""

    uri: str
    # The path alone names it in errors (the query may carry env values).
    path: str
    uds: str | None
    options: dict[str, Any]


def _dial(c: Berth | AsyncBerth, path: str, params: Mapping[str, str] | list[tuple[str, str]] | None = None) -> _Dial:
    # The origin is http(s)://host[:port][/prefix]; a unix socket's is http://berth.
    uri = "ws" + c._origin[len("http") :] + path + ("?" + urlencode(params) if params else "")
    headers = {"Authorization": c._http.headers["Authorization"]} if "Authorization" in c._http.headers else {}
    options = {
        "additional_headers": headers,
        "user_agent_header": c._http.headers.get("User-Agent"),
        "compression": None,
        "max_size": _MAX_MESSAGE,
        "open_timeout": c._http.timeout.connect,
    }
    return _Dial(uri, path, c._uds, options)


def _dial_error(c: Berth | AsyncBerth, e: Exception) -> BerthError:
    """The SDK's exception for a WebSocket that did not open: the daemon's
    error answer as for any call, else the daemon is unreachable."""
    if isinstance(e, InvalidStatus):
        try:
            body = json.loads(e.response.body)
        except ValueError:
            body = None
        return error_for(e.response.status_code, body)
    return DaemonUnreachable(f"berth daemon not reachable at {c.url}: {e}")


def _text(m: dict[str, Any]) -> str:
    return json.dumps(m, separators=(",", ":"))


def _input(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _resize(rows: int, cols: int) -> str:
    """The resize message, checked here: the daemon's refusal would only come
    later, as an error event."""
    for name, n in (("rows", rows), ("cols", cols)):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_TTY:
            raise InvalidArgument(f"resize: {name} {n!r}; each must be 1 to {_MAX_TTY}")
    return _text({"type": "resize", "rows": rows, "cols": cols})


class _Attachment:
    """What the messages of an attachment mean, shared by both terminals."""

    def __init__(self, first: str | bytes, path: str) -> None:
        try:
            m = json.loads(first) if isinstance(first, str) else None
        except ValueError:
            m = None
        if not isinstance(m, dict) or m.get("type") != "attached" or not int(m.get("pid") or 0) > 0:
            raise Unavailable(f"{path}: the attachment did not begin with an attached message: {first[:200]!r}")
        self.pid: int = int(m["pid"])
        # The terminal's size (None for a process without one): as attached,
        # then as last asked for by resize.
        self.tty: TTY | None = TTY.from_json(m.get("tty"))
        # How the process ended, once the exit event came.
        self.result: ExecResult | None = None
        self._closed = False
        # The last error event's error: the daemon sends the one that ends
        # the attachment (the sandbox went away) as one, then as the close reason.
        self._error: BerthError | None = None
        # wait's output so far: a wait that timed out goes on where it stopped.
        self._out, self._err = bytearray(), bytearray()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pid={self.pid}, tty={self.tty})"

    @property
    def _done(self) -> bool:
        return self.result is not None or self._closed

    def _event(self, msg: str | bytes) -> TerminalEvent | None:
        """The event of a message; None for one to skip (a type from a newer daemon)."""
        if isinstance(msg, bytes):
            return TerminalEvent("stdout", data=msg)
        try:
            m = json.loads(msg)
        except ValueError as e:
            raise Unavailable(f"process {self.pid}: a terminal message that is not JSON: {e}") from e
        typ = m.get("type") if isinstance(m, dict) else None
        if typ == "stderr":
            data = m.get("data")
            return TerminalEvent("stderr", data=base64.b64decode(data) if isinstance(data, str) else b"")
        if typ == "exit":
            if not isinstance(m.get("result"), dict):
                raise Unavailable(f"process {self.pid}: an exit message without a result")
            self.result = ExecResult.from_json(m["result"])
            return TerminalEvent("exit", result=self.result)
        if typ == "error":
            err = m.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                reason = err.get("reason")
                e = error_from_class(str(err.get("class")), err["message"], reason if isinstance(reason, str) else None)
            else:
                e = InternalError("an error message without an error")
            self._error = e
            return TerminalEvent("error", error=e)
        return None

    def _ended(self, e: ConnectionClosed) -> BerthError | None:
        """What a closed WebSocket means when reading: the end (None) after
        the exit or our own close, else an error."""
        return None if self._done else self._broken(e)

    def _send_error(self, e: ConnectionClosed) -> BerthError:
        if self._done:
            return Conflict(f"process {self.pid}: the attachment is closed (the process exited, or close() was called)")
        return self._broken(e)

    def _broken(self, e: ConnectionClosed) -> BerthError:
        # The daemon closes with the reason (1001, cut to fit a close frame)
        # when the sandbox goes away, after an error event with its class.
        if e.rcvd is not None and e.rcvd.reason:
            last = self._error
            if last is not None and last.message.startswith(e.rcvd.reason):
                return type(last)(last.message, reason=last.reason)
            return Unavailable(e.rcvd.reason)
        if e.rcvd is not None and e.rcvd.code == 1000:
            return Unavailable(f"process {self.pid}: the daemon closed the attachment before the process exited")
        return Unavailable(f"process {self.pid}: the connection to the daemon broke ({e})")

    def _collect(self, ev: TerminalEvent) -> ExecResult | None:
        """Keep wait's output; the result, with it, at the exit."""
        if ev.type == "stdout":
            self._out += ev.data
        elif ev.type == "stderr":
            self._err += ev.data
        elif ev.result is not None:
            res = dataclasses.replace(ev.result, stdout_bytes=bytes(self._out), stderr_bytes=bytes(self._err))
            self._out, self._err = bytearray(), bytearray()
            return res
        return None

    def _timeout(self, what: str, timeout: float) -> DeadlineExceeded:
        return DeadlineExceeded(f"process {self.pid}: {what} after {timeout:g}s")


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Terminal(_Attachment):
    """An attachment to a process over a WebSocket, from
    :meth:`Sandbox.open_terminal` or :meth:`Sandbox.attach`.

    Its output comes from :meth:`recv` or iteration, as :class:`TerminalEvent`
    (stdout, stderr, error, and exit last); its input goes to :meth:`send`.
    What the process printed before the attachment comes first (a
    terminal's recent screen, another process's kept output). Closing it
    (or leaving the ``with`` block) leaves the process running: attach again
    by ``pid``. One thread may read while another sends.
    """

    def __init__(self, ws: ClientConnection, first: str | bytes, path: str) -> None:
        super().__init__(first, path)
        self._ws = ws

    @classmethod
    def _open(cls, c: Berth, path: str, params: Mapping[str, str] | list[tuple[str, str]] | None = None) -> Terminal:
        d = _dial(c, path, params)
        try:
            # Entered as a context manager, which close() ends: websockets 17.1
            # deprecated using what connect() returns directly.
            if d.uds is not None:
                ws = websockets.sync.client.unix_connect(d.uds, d.uri, **d.options).__enter__()
            else:
                ws = websockets.sync.client.connect(d.uri, **d.options).__enter__()
        except (OSError, TimeoutError, WebSocketException) as e:
            raise _dial_error(c, e) from e
        try:
            return cls(ws, ws.recv(timeout=d.options["open_timeout"]), d.path)
        except BaseException as e:
            ws.close()
            if isinstance(e, (TimeoutError, ConnectionClosed)):
                raise Unavailable(f"{d.path}: no attached message from the daemon: {e}") from e
            raise

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[TerminalEvent]:
        """The events until the exit (the last) or :meth:`close`."""
        while (ev := self.recv()) is not None:
            yield ev

    def send(self, data: bytes | str) -> None:
        """Send bytes (a str as UTF-8) to the process's input: keys to a
        terminal (``"\\x03"`` is Ctrl-C, ``"\\x04"`` Ctrl-D), lines to a REPL."""
        self._write(_input(data))

    def resize(self, rows: int, cols: int) -> None:
        """Give the terminal a new size (each of rows and cols 1 to 10000)."""
        self._write(_resize(rows, cols))
        self.tty = TTY(rows, cols)

    def close_stdin(self) -> None:
        """Close the process's input (EOF; on a terminal, its EOF character)."""
        self._write(_text({"type": "eof"}))

    def _write(self, msg: bytes | str) -> None:
        try:
            self._ws.send(msg)
        except ConnectionClosed as e:
            raise self._send_error(e) from e

    def recv(self, timeout: float | None = None) -> TerminalEvent | None:
        """The next event; None after the exit event or :meth:`close`. Raises
        :class:`DeadlineExceeded` when none comes within ``timeout`` seconds (the
        attachment goes on), :class:`Unavailable` when the attachment broke (the
        sandbox went away, the daemon stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            try:
                msg = self._ws.recv(timeout=_left(deadline))
            except TimeoutError as e:
                raise self._timeout("no output", timeout or 0) from e
            except ConnectionClosed as e:
                if (err := self._ended(e)) is not None:
                    raise err from e
                return None
            if (ev := self._event(msg)) is not None:
                return ev
        return None

    def wait(self, timeout: float | None = None) -> ExecResult:
        """Read until the process exits and return how it ended, with the
        output read meanwhile (a terminal's as stdout). Raises
        :class:`DeadlineExceeded` after ``timeout`` seconds: the process and the
        attachment go on, and the next wait keeps the output read so far."""
        if self.result is not None:
            return self.result
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                ev = self.recv(_left(deadline))
            except DeadlineExceeded:
                raise self._timeout("still running", timeout or 0) from None
            if ev is None:
                raise Conflict(f"process {self.pid}: the attachment is closed")
            if (res := self._collect(ev)) is not None:
                self.result = res
                return res

    def close(self) -> None:
        """End the attachment; the process goes on."""
        self._closed = True
        self._ws.close()


class AsyncTerminal(_Attachment):
    """:class:`Terminal` for asyncio, from :meth:`AsyncSandbox.open_terminal` or
    :meth:`AsyncSandbox.attach` (``async for``, ``async with``)."""

    def __init__(self, ws: AsyncConnection, first: str | bytes, path: str) -> None:
        super().__init__(first, path)
        self._ws = ws

    @classmethod
    async def _open(cls, c: AsyncBerth, path: str, params: Mapping[str, str] | list[tuple[str, str]] | None = None) -> AsyncTerminal:
        d = _dial(c, path, params)
        try:
            if d.uds is not None:
                ws = await websockets.asyncio.client.unix_connect(d.uds, d.uri, **d.options)
            else:
                ws = await websockets.asyncio.client.connect(d.uri, **d.options)
        except (OSError, asyncio.TimeoutError, WebSocketException) as e:
            raise _dial_error(c, e) from e
        try:
            return cls(ws, await asyncio.wait_for(ws.recv(), d.options["open_timeout"]), d.path)
        except BaseException as e:
            await ws.close()
            if isinstance(e, (asyncio.TimeoutError, ConnectionClosed)):
                raise Unavailable(f"{d.path}: no attached message from the daemon: {e}") from e
            raise

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def __aiter__(self) -> AsyncIterator[TerminalEvent]:
        while (ev := await self.recv()) is not None:
            yield ev

    async def send(self, data: bytes | str) -> None:
        await self._write(_input(data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._write(_resize(rows, cols))
        self.tty = TTY(rows, cols)

    async def close_stdin(self) -> None:
        await self._write(_text({"type": "eof"}))

    async def _write(self, msg: bytes | str) -> None:
        try:
            await self._ws.send(msg)
        except ConnectionClosed as e:
            raise self._send_error(e) from e

    async def recv(self, timeout: float | None = None) -> TerminalEvent | None:
        """As :meth:`Terminal.recv` (cancelling it loses nothing)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            try:
                msg = await asyncio.wait_for(self._ws.recv(), _left(deadline))
            except asyncio.TimeoutError as e:
                raise self._timeout("no output", timeout or 0) from e
            except ConnectionClosed as e:
                if (err := self._ended(e)) is not None:
                    raise err from e
                return None
            if (ev := self._event(msg)) is not None:
                return ev
        return None

    async def wait(self, timeout: float | None = None) -> ExecResult:
        """As :meth:`Terminal.wait`."""
        if self.result is not None:
            return self.result
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                ev = await self.recv(_left(deadline))
            except DeadlineExceeded:
                raise self._timeout("still running", timeout or 0) from None
            if ev is None:
                raise Conflict(f"process {self.pid}: the attachment is closed")
            if (res := self._collect(ev)) is not None:
                self.result = res
                return res

    async def close(self) -> None:
        self._closed = True
        await self._ws.close()


__all__ = ["AsyncTerminal", "Terminal"]
