"""The network bench's client: the same program inside a sandbox (through
berth's egress) and on the host (in the test internet's namespace, straight
to the server), so that only the path differs.

    netbench.py latency HOST ADDR PORT PATH COUNT CAFILE|- [HEADER]
        COUNT GETs, each on a new connection (TLS when CAFILE is given),
        one line per request: milliseconds from connect to the last byte.
    netbench.py download HOST ADDR PORT PATH BYTES
        one GET of BYTES; prints megabytes per second.

ADDR "-" resolves HOST first (inside a sandbox the resolver is berth's, which
pins the answer); the timing starts after it. Every answer is checked: a
status other than 200 or a short body fails the run.
"""

import socket
import ssl
import sys
import time


def connect(host, addr, port, ctx):
    s = socket.create_connection((addr, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ctx is not None:
        s = ctx.wrap_socket(s, server_hostname=host)
    return s


def head(s):
    """Reads the response head; returns the status, the length and what of the body came with it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = s.recv(65536)
        if not got:
            raise SystemExit("connection closed before the response head")
        buf += got
    raw, rest = buf.split(b"\r\n\r\n", 1)
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = None
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
    if length is None:
        raise SystemExit("no Content-Length in " + lines[0])
    return status, length, rest


def get(host, addr, port, path, ctx, header=""):
    s = connect(host, addr, port, ctx)
    try:
        extra = header + "\r\n" if header else ""
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode())
        status, length, body = head(s)
        if status != 200:
            raise SystemExit(f"status {status}: {body[:200]!r}")
        n = len(body)
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while n < length:
            k = s.recv_into(view)
            if k == 0:
                raise SystemExit(f"body cut at {n} of {length} bytes")
            n += k
        return n
    finally:
        s.close()


def main(argv):
    mode, host, addr, port, path = argv[1], argv[2], argv[3], int(argv[4]), argv[5]
    if addr == "-":
        addr = socket.gethostbyname(host)
    if mode == "latency":
        count, cafile = int(argv[6]), argv[7]
        header = argv[8] if len(argv) > 8 else ""
        ctx = None if cafile == "-" else ssl.create_default_context(cafile=cafile)
        get(host, addr, port, path, ctx, header)  # warm-up: berth makes its certificate for a host on first use
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            get(host, addr, port, path, ctx, header)
            out.append((time.perf_counter() - t0) * 1e3)
        print("\n".join(f"{ms:.4f}" for ms in out))
    elif mode == "download":
        want = int(argv[6])
        t0 = time.perf_counter()
        n = get(host, addr, port, path, None)
        secs = time.perf_counter() - t0
        if n != want:
            raise SystemExit(f"got {n} bytes, want {want}")
        print(f"{n / secs / 1e6:.1f}")
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main(sys.argv)
