#!/usr/bin/env python3
"""A small coding agent that lives inside a berth sandbox.

It serves a WebSocket at /chat and GET /health on 127.0.0.1 (port 8000 by
default; --port or $AGENT_PORT), with Python's standard library only. A
client sends {"message": "..."}; the agent asks its model what to do, does
it here (runs a shell command, writes a file, in its working directory) and
streams JSON events back:

    {"type": "token", "text": "I "}            the reply, a word at a time
    {"type": "tool", "tool": "write", "path": ..., "bytes": ...}
    {"type": "tool", "tool": "shell", "command": ..., "output": ..., "exit_code": ...}
    {"type": "done", "turn": N}                N: this turn's number in the conversation
    {"type": "error", "message": ...}          (then done)

The model goes over the network like a real one: each turn POSTs the whole
conversation, {"messages": [{"role": ..., "content": ...}, ...]}, to
$MODEL_URL with "Authorization: Bearer $MODEL_API_KEY", and gets back a plan:
{"reply": "...", "command": "..." or null, "write": {"path", "content"} or null}.
In a berth sandbox $MODEL_API_KEY is a placeholder (berth-ph-...) that the
daemon replaces by the real key on the way out, so the key never enters the
sandbox. Without $MODEL_URL a scripted model built in here answers, and
the example runs with no network at all.

The conversation is kept in conversation.jsonl in the working directory,
one JSON object a line, so it survives a reconnect, and a restart.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_NAME = "conversation.jsonl"
MAX_MESSAGE = 1 << 20  # the largest client message accepted
MAX_OUTPUT = 64 << 10  # a command's output sent back, at most
TOKEN_DELAY = 0.02  # seconds between tokens, so that streaming shows

# RFC 6455
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class Closed(Exception):
    """The WebSocket ended (a close frame, or the connection went)."""

    def __init__(self, code: int = 1000, reason: str = "") -> None:
        super().__init__(f"closed {code} {reason}".strip())
        self.code, self.reason = code, reason


class WebSocket:
    """The server side of one WebSocket connection, over the upgraded
    HTTP connection's reader and writer. Reads happen on one thread;
    send may be called from any."""

    def __init__(self, rfile, wfile) -> None:
        self.rfile, self.wfile = rfile, wfile
        self._send_lock = threading.Lock()
        self.closed = False

    def _read(self, n: int) -> bytes:
        b = self.rfile.read(n)
        if len(b) < n:
            raise Closed(1006, "connection lost")
        return b

    def _frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = self._read(2)
        fin, opcode = bool(b0 & 0x80), b0 & 0x0F
        if b0 & 0x70:
            self.close(1002, "reserved bits set")
            raise Closed(1002, "reserved bits set")
        if not b1 & 0x80:
            self.close(1002, "client frames must be masked")
            raise Closed(1002, "unmasked client frame")
        length = b1 & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._read(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._read(8))
        if opcode >= 0x8 and (length > 125 or not fin):
            self.close(1002, "bad control frame")
            raise Closed(1002, "bad control frame")
        if length > MAX_MESSAGE:
            self.close(1009, "message too big")
            raise Closed(1009, "message too big")
        mask = self._read(4)
        payload = bytearray(self._read(length))
        for i in range(length):
            payload[i] ^= mask[i & 3]
        return fin, opcode, bytes(payload)

    def receive(self) -> str:
        """The next text message; answers pings and closes on the way."""
        parts: list[bytes] = []
        kind = None
        while True:
            fin, opcode, payload = self._frame()
            if opcode == OP_PING:
                self._send(OP_PONG, payload)
                continue
            if opcode == OP_PONG:
                continue
            if opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close(1000 if code == 1005 else code)
                raise Closed(code, payload[2:].decode("utf-8", "replace"))
            if opcode == OP_CONT:
                if kind is None:
                    self.close(1002, "continuation without a start")
                    raise Closed(1002, "stray continuation")
            elif opcode in (OP_TEXT, OP_BINARY):
                if kind is not None:
                    self.close(1002, "new message inside a fragmented one")
                    raise Closed(1002, "interleaved message")
                kind = opcode
            else:
                self.close(1002, "unknown opcode")
                raise Closed(1002, f"opcode {opcode}")
            parts.append(payload)
            if sum(map(len, parts)) > MAX_MESSAGE:
                self.close(1009, "message too big")
                raise Closed(1009, "message too big")
            if fin:
                break
        if kind != OP_TEXT:
            self.close(1003, "text messages only")
            raise Closed(1003, "binary message")
        try:
            return b"".join(parts).decode("utf-8")
        except UnicodeDecodeError:
            self.close(1007, "not UTF-8")
            raise Closed(1007, "not UTF-8") from None

    def _send(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        with self._send_lock:
            if self.closed:
                raise Closed(1006, "already closed")
            try:
                self.wfile.write(head + payload)
                self.wfile.flush()
            except OSError as e:
                self.closed = True
                raise Closed(1006, str(e)) from e
            if opcode == OP_CLOSE:
                self.closed = True

    def send_json(self, obj: dict) -> None:
        self._send(OP_TEXT, json.dumps(obj).encode())

    def close(self, code: int = 1000, reason: str = "") -> None:
        try:
            self._send(OP_CLOSE, struct.pack("!H", code) + reason.encode()[:120])
        except Closed:
            pass


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()


class Conversation:
    """The conversation log, conversation.jsonl: one entry a line, user and
    assistant in turn. One turn runs at a time, whichever connection asks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def entries(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def append(self, *entries: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for e in entries:
                f.write(json.dumps(e) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def turns(self) -> int:
        return sum(1 for e in self.entries() if e.get("role") == "user")


def model_messages(entries: list[dict]) -> list[dict]:
    """The conversation as a chat model reads it: tool results as tool messages."""
    out = []
    for e in entries:
        out.append({"role": e["role"], "content": e.get("content", "")})
        for tool in e.get("tools", []):
            out.append({"role": "tool", "content": json.dumps(tool)})
    return out


def remote_model(url: str, messages: list[dict]) -> dict:
    """One call to the model server: the conversation in, a plan out."""
    req = urllib.request.Request(
        url,
        data=json.dumps({"messages": messages}).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ.get("MODEL_API_KEY", ""),
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"the model answered {e.code}: {e.read()[:200].decode('utf-8', 'replace')}") from e
    except urllib.error.URLError as e:
        raise RuntimeError(f"the model at {url} is not reachable: {e.reason}") from e


def scripted_model(messages: list[dict]) -> dict:
    """A stand-in model, so that the example runs without a network."""
    text = messages[-1]["content"]
    earlier = sum(1 for m in messages[:-1] if m["role"] == "user")
    name = re.search(r"(?:file|called|named)\s+([\w./-]+\.\w+)", text)
    if name:
        path = name.group(1)
        return {
            "reply": f"Sure: I am writing {path} and then looking at it.",
            "command": f"ls -l {path} && cat {path}",
            "write": {"path": path, "content": f"hello from the agent, turn {earlier + 1}\n"},
        }
    run = re.match(r"\s*(?:run|\$)\s+(.+)", text, re.S)
    if run:
        return {"reply": "Running it.", "command": run.group(1), "write": None}
    return {
        "reply": f"This is turn {earlier + 1} of our conversation ({earlier} before it). "
        "Ask me to make a file called x.txt, or to run a command.",
        "command": "uname -sr",
        "write": None,
    }


class Agent:
    def __init__(self, workdir: str, model_url: str | None) -> None:
        self.workdir = workdir
        self.model_url = model_url
        self.log = Conversation(os.path.join(workdir, LOG_NAME))

    def plan(self, messages: list[dict]) -> dict:
        if self.model_url:
            return remote_model(self.model_url, messages)
        return scripted_model(messages)

    def turn(self, ws: WebSocket, message: str) -> None:
        with self.log.lock:
            history = self.log.entries()
            number = 1 + sum(1 for e in history if e.get("role") == "user")
            user = {"role": "user", "content": message, "time": time.time()}
            try:
                plan = self.plan(model_messages(history + [user]))
            except Exception as e:  # the model is down: say so, keep the connection
                ws.send_json({"type": "error", "message": str(e)})
                ws.send_json({"type": "done", "turn": number})
                return
            if not isinstance(plan, dict):
                plan = {"reply": f"(the model answered {type(plan).__name__}, not a plan)"}
            reply = str(plan.get("reply") or "")
            words = reply.split(" ")
            for i, word in enumerate(words):
                ws.send_json({"type": "token", "text": word + (" " if i < len(words) - 1 else "")})
                time.sleep(TOKEN_DELAY)
            tools = []
            write = plan.get("write")
            if isinstance(write, dict) and write.get("path"):
                tools.append(self.write(str(write["path"]), str(write.get("content") or "")))
                ws.send_json({"type": "tool", **tools[-1]})
            if plan.get("command"):
                tools.append(self.shell(str(plan["command"])))
                ws.send_json({"type": "tool", **tools[-1]})
            self.log.append(user, {"role": "assistant", "content": reply, "tools": tools, "time": time.time()})
            ws.send_json({"type": "done", "turn": number})

    def write(self, path: str, content: str) -> dict:
        full = os.path.join(self.workdir, path)
        try:
            os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(content)
            return {"tool": "write", "path": path, "bytes": len(content.encode())}
        except OSError as e:
            return {"tool": "write", "path": path, "error": str(e)}

    def shell(self, command: str) -> dict:
        try:
            r = subprocess.run(
                command, shell=True, cwd=self.workdir, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
            )
            out, code = r.stdout, r.returncode
        except subprocess.TimeoutExpired as e:
            out, code = (e.stdout or b"") + b"\n[timed out after 120 s]", 124
        text = out[:MAX_OUTPUT].decode("utf-8", "replace")
        return {"tool": "shell", "command": command, "output": text, "exit_code": code}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # a 101 must not say HTTP/1.0
    server_version = "berth-agent-inside/1"
    agent: Agent  # set on the subclass main makes

    def log_message(self, fmt: str, *args) -> None:
        sys.stderr.write("agent: %s\n" % (fmt % args))

    def _json(self, status: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._json(200, {"ok": True, "turns": self.agent.log.turns(), "workdir": self.agent.workdir})
        elif path == "/chat":
            self.chat()
        else:
            self._json(404, {"error": f"no {path} here: /chat (WebSocket) and /health"})

    def chat(self) -> None:
        key = self.headers.get("Sec-WebSocket-Key", "")
        upgrade = self.headers.get("Upgrade", "").lower() == "websocket"
        connection = "upgrade" in [t.strip().lower() for t in self.headers.get("Connection", "").split(",")]
        if not (upgrade and connection and key):
            self._json(426, {"error": "/chat is a WebSocket: send Upgrade: websocket"})
            return
        if self.headers.get("Sec-WebSocket-Version") != "13":
            self.send_response(426)
            self.send_header("Sec-WebSocket-Version", "13")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept_key(key))
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True  # whatever happens, this connection ends with the WebSocket
        ws = WebSocket(self.rfile, self.wfile)
        try:
            while True:
                text = ws.receive()
                try:
                    msg = json.loads(text)
                    message = msg["message"]
                    if not isinstance(message, str):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    ws.send_json({"type": "error", "message": 'send {"message": "..."}'})
                    continue
                self.agent.turn(ws, message)
        except Closed:
            pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default=os.environ.get("AGENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("AGENT_PORT", "8000")))
    p.add_argument("--workdir", default=os.environ.get("AGENT_WORKDIR", os.getcwd()))
    args = p.parse_args()
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    handler = type("AgentHandler", (Handler,), {"agent": Agent(workdir, os.environ.get("MODEL_URL") or None)})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    model = os.environ.get("MODEL_URL") or "the built-in scripted model"
    print(f"agent: listening on {args.host}:{args.port}, workdir {workdir}, model {model}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
