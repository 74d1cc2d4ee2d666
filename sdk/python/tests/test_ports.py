"""Ports through the SDK, against the session daemon: a small HTTP server
inside a sandbox (network mode none: the daemon reaches it from inside),
its URLs, the access token in each of its forms, public ports, and the
errors of a closed port, a bad port number and a stopped sandbox."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import httpx
import pytest

from berth import (
    ACCESS_TOKEN_HEADER,
    AsyncBerth,
    Berth,
    Conflict,
    DeadlineExceeded,
    InvalidArgument,
    Port,
    Sandbox,
    SandboxInfo,
    Unauthenticated,
    Unavailable,
)
from berth.errors import error_for

# Answers every GET and POST with what it received, as JSON: the request
# line's target, the headers and the body.
ECHO = """\
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "headers": dict(self.headers),
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""

PORT = 8000


def serve(sb: Sandbox, port: int = PORT, delay: float = 0) -> Port:
    """Start the echo server on port inside sb (after delay seconds) and wait for it."""
    sb.write("/home/user/echo.py", ECHO)
    sb.start_process(f"sleep {delay}; exec python3 /home/user/echo.py {port}")
    return sb.wait_for_port(port, timeout=20)


def raised(r: httpx.Response) -> Exception:
    """The SDK's exception for a daemon's error answer on a port's URL."""
    assert r.headers["content-type"] == "application/json", r.text
    return error_for(r.status_code, r.json())


def test_a_private_port_and_its_token(client: Berth, berth_url: str) -> None:
    with client.create() as sb:
        token = sb.access_token
        assert len(token) >= 32 and sb.public_ports == []
        assert sb.info.raw["network"]["mode"] == "none"
        started = time.monotonic()
        p = serve(sb, delay=1)
        assert time.monotonic() - started >= 0.9  # it waited for the server
        assert (p.port, p.address, p.proto, p.public) == (PORT, "127.0.0.1", "tcp", False)
        assert [x.port for x in sb.ports()] == [PORT]

        prefix = f"{berth_url}/v1/sandboxes/{sb.id}/ports/{PORT}"
        assert sb.url(PORT) == f"{prefix}/?berth_access_token={token}"
        assert sb.url(PORT, with_token=False) == f"{prefix}/"
        assert sb.url(PORT, "/a/b?x=1#top") == f"{prefix}/a/b?x=1&berth_access_token={token}#top"

        # No token, a wrong one.
        r = httpx.get(sb.url(PORT, "/x", with_token=False))
        assert r.status_code == 401
        err = raised(r)
        assert isinstance(err, Unauthenticated) and sb.id in err.message and str(PORT) in err.message
        r = httpx.get(sb.url(PORT, with_token=False), headers={ACCESS_TOKEN_HEADER: "not-the-token"})
        assert r.status_code == 401 and isinstance(raised(r), Unauthenticated)

        # The header: the server sees neither it nor the path form's prefix.
        r = httpx.post(sb.url(PORT, "/api/run?n=2", with_token=False), headers={ACCESS_TOKEN_HEADER: token}, content=b"ping")
        assert r.status_code == 200, r.text
        seen = r.json()
        assert (seen["method"], seen["path"], seen["body"]) == ("POST", "/api/run?n=2", "ping")
        assert ACCESS_TOKEN_HEADER.lower() not in {h.lower() for h in seen["headers"]}
        assert seen["headers"]["X-Forwarded-Prefix"] == f"/v1/sandboxes/{sb.id}/ports/{PORT}"

        # The query parameter: removed before the server, turned into a cookie
        # that a client with a cookie jar (a browser) sends from then on.
        with httpx.Client() as browser:
            r = browser.get(sb.url(PORT, "/page?q=1"))
            assert r.status_code == 200, r.text
            assert r.json()["path"] == "/page?q=1"
            cookie = r.headers["set-cookie"]
            assert cookie.startswith(f"berth_access_token={token};") and "HttpOnly" in cookie
            r = browser.get(sb.url(PORT, "/script.js", with_token=False))
            assert r.status_code == 200, r.text
            assert "berth_access_token" not in r.json()["headers"].get("Cookie", "")

        # The cookie sent by hand: the server keeps its own cookies, not berth's.
        r = httpx.get(sb.url(PORT, with_token=False), headers={"Cookie": f"berth_access_token={token}; theme=dark"})
        assert r.status_code == 200, r.text
        assert r.json()["headers"]["Cookie"] == "theme=dark"

        # A new token: the old one opens nothing, in any form.
        new = sb.rotate_access_token()
        assert new != token and sb.access_token == new and sb.info.raw["access_token"] == new
        assert client.get(sb.id).access_token == new
        for kw in ({"headers": {ACCESS_TOKEN_HEADER: token}}, {"headers": {"Cookie": f"berth_access_token={token}"}}):
            r = httpx.get(sb.url(PORT, with_token=False), **kw)
            assert r.status_code == 401, kw
        assert httpx.get(sb.url(PORT, "/?berth_access_token=" + token, with_token=False)).status_code == 401
        assert httpx.get(sb.url(PORT)).status_code == 200
        assert new in sb.url(PORT)


def test_host_form(client: Berth, berth_url: str) -> None:
    domain = client.version()["ports_domain"]
    assert domain == "berth.localhost"
    with client.create() as sb:
        serve(sb)
        daemon = urlsplit(berth_url)
        url = sb.url(PORT, "/app/", host_form=True)
        assert url == f"http://{PORT}-{sb.id}.{domain}:{daemon.port}/app/?berth_access_token={sb.access_token}"
        assert sb.url(PORT, host_form=True, with_token=False) == f"http://{PORT}-{sb.id}.{domain}:{daemon.port}/"
        # *.localhost need not resolve here: send the name as Host to the daemon's address.
        u = urlsplit(url)
        r = httpx.get(f"{berth_url}{u.path}?{u.query}", headers={"Host": u.netloc})
        assert r.status_code == 200, r.text
        assert r.json()["path"] == "/app/" and r.json()["headers"]["Host"] == u.netloc
        assert "Path=/;" in r.headers["set-cookie"]
        r = httpx.get(f"{berth_url}/", headers={"Host": u.netloc})
        assert r.status_code == 401 and isinstance(raised(r), Unauthenticated)


def test_public_ports(client: Berth) -> None:
    with client.create(public_ports=[PORT, PORT]) as sb:
        assert sb.public_ports == [PORT]
        assert sb.info.raw["public_ports"] == [PORT]
        p = serve(sb)
        assert p.public
        assert "berth_access_token" not in sb.url(PORT)
        r = httpx.get(sb.url(PORT, "/open"))
        assert r.status_code == 200 and r.json()["path"] == "/open"

        assert sb.set_public_ports([]).public_ports == []
        assert sb.public_ports == [] and "public_ports" not in sb.info.raw
        assert not sb.ports()[0].public
        assert httpx.get(sb.url(PORT, with_token=False)).status_code == 401
        assert httpx.get(sb.url(PORT)).status_code == 200

        assert sb.set_public_ports([9000, PORT]).public_ports == [PORT, 9000]
        assert client.get(sb.id).public_ports == [PORT, 9000]
        assert httpx.get(sb.url(PORT, with_token=False)).status_code == 200

        with pytest.raises(InvalidArgument) as exc:
            sb.set_public_ports([PORT, 0])
        assert "public_ports[1]" in exc.value.message
        assert sb.public_ports == [PORT, 9000]
    with pytest.raises(InvalidArgument) as exc:
        client.create(public_ports=[70000])
    assert "public_ports[0]" in exc.value.message and "70000" in exc.value.message
    sb = client.get_or_create({"suite": "sdk-ports"}, public_ports=[3000])
    try:
        assert sb.public_ports == [3000] and sb.access_token
    finally:
        sb.delete()


def test_a_closed_port_and_bad_port_numbers(client: Berth, berth_url: str) -> None:
    with client.create() as sb:
        assert sb.ports() == []
        r = httpx.get(sb.url(PORT))
        assert r.status_code == 502
        err = raised(r)
        assert isinstance(err, Unavailable) and err.reason == "port_closed"
        assert str(PORT) in err.message and sb.id in err.message

        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as exc:
            sb.wait_for_port(PORT, timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 5
        assert f"port {PORT}" in exc.value.message and sb.id in exc.value.message

        for bad in (0, 70000, -1):
            with pytest.raises(InvalidArgument) as exc:
                sb.url(bad)
            assert str(bad) in exc.value.message
            with pytest.raises(InvalidArgument):
                sb.wait_for_port(bad, timeout=1)
            # The daemon refuses them too, naming the port.
            r = httpx.get(f"{berth_url}/v1/sandboxes/{sb.id}/ports/{bad}/", headers={ACCESS_TOKEN_HEADER: sb.access_token})
            assert r.status_code == 400
            err = raised(r)
            assert isinstance(err, InvalidArgument) and f"port: {bad} " in err.message
        with pytest.raises(InvalidArgument):
            sb.url("8000")  # type: ignore[arg-type]
        r = httpx.get(f"{berth_url}/v1/sandboxes/{sb.id}/ports/http/", headers={ACCESS_TOKEN_HEADER: sb.access_token})
        assert r.status_code == 400 and isinstance(raised(r), InvalidArgument)


def test_a_stopped_sandbox(client: Berth) -> None:
    with client.create() as sb:
        serve(sb)
        token = sb.access_token
        sb.stop()
        with pytest.raises(Conflict):
            sb.ports()
        with pytest.raises(Conflict) as exc:
            sb.wait_for_port(PORT, timeout=5)
        assert "stopped" in exc.value.message
        r = httpx.get(sb.url(PORT))
        assert r.status_code == 409 and isinstance(raised(r), Conflict)
        # Without the token the answer says nothing of the sandbox's state.
        assert httpx.get(sb.url(PORT, with_token=False)).status_code == 401
        sb.start()
        assert sb.access_token == token
        assert sb.ports() == []  # its processes ended with it
        serve(sb)
        assert httpx.get(sb.url(PORT)).status_code == 200


def test_urls_without_a_daemon() -> None:
    info = SandboxInfo(id="sb-abc", state="running", public_ports=[443], access_token="t0k")
    with Berth("http://127.0.0.1:1/base") as c:
        sb = Sandbox(c, info)
        assert sb.url(80) == "http://127.0.0.1:1/base/v1/sandboxes/sb-abc/ports/80/?berth_access_token=t0k"
        assert sb.url(80, "a") == "http://127.0.0.1:1/base/v1/sandboxes/sb-abc/ports/80/a?berth_access_token=t0k"
        assert sb.url(443, "/x") == "http://127.0.0.1:1/base/v1/sandboxes/sb-abc/ports/443/x"
    with Berth("unix:///nonexistent/berth.sock") as c:
        with pytest.raises(InvalidArgument) as exc:
            Sandbox(c, info).url(80)
        assert "unix socket" in exc.value.message and "berth port-forward" in exc.value.message


def test_async_ports(client: Berth, berth_url: str) -> None:
    async def main() -> None:
        async with AsyncBerth(berth_url) as c, await c.create(public_ports=[PORT]) as sb:
            assert sb.public_ports == [PORT] and sb.access_token
            assert await sb.ports() == []
            client.get(sb.id).start_process(["python3", "-c", ECHO, str(PORT)])
            p = await sb.wait_for_port(PORT, timeout=20)
            assert p.port == PORT and p.public
            url = await sb.url(PORT, "/hi")
            assert "berth_access_token" not in url
            host = await sb.url(PORT, host_form=True, with_token=False)
            assert host.startswith(f"http://{PORT}-{sb.id}.berth.localhost:")
            async with httpx.AsyncClient() as h:
                assert (await h.get(url)).json()["path"] == "/hi"
                await sb.set_public_ports([])
                assert sb.public_ports == []
                assert (await h.get(url)).status_code == 401
                old = sb.access_token
                assert await sb.rotate_access_token() != old
                r = await h.get(await sb.url(PORT, "/hi"))
                assert r.status_code == 200 and sb.access_token in str(r.request.url)
            with pytest.raises(DeadlineExceeded):
                await sb.wait_for_port(PORT + 1, timeout=0.3)
            with pytest.raises(InvalidArgument):
                await sb.url(0)

    asyncio.run(main())
