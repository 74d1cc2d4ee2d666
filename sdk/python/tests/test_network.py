"""Networks, secrets and the egress log through the SDK, against the session
daemon, whose egress namespace (conftest's egress_netns) holds one HTTP
server at 203.0.113.10:8080."""

from __future__ import annotations

import asyncio

import pytest

from berth import AsyncBerth, Berth, Conflict, InvalidArgument, NotFound
from berth.errors import NotImplementedByRuntime
from berth.deepagents import BerthSandbox

WEB = "http://203.0.113.10:8080/hello.txt"



def test_allowlist_egress_and_a_change(client: Berth) -> None:
    with client.create(allow=["203.0.113.10/32:8080"]) as sb:
        assert sb.info.raw["network"]["mode"] == "allowlist"
        r = sb.exec(f"curl -sS -m 5 {WEB}")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "hello from the test net\n"
        assert sb.exec("curl -sS -m 5 http://203.0.113.66:8080/").exit_code != 0
        records = sb.egress()
        ok = [x for x in records if x["allowed"] and x["addr"] == "203.0.113.10"]
        assert ok and ok[0]["proto"] == "tcp" and ok[0]["bytes_in"] > 0
        denied = sb.egress(denied=True)
        assert any(x["addr"] == "203.0.113.66" and not x["allowed"] and x["rule"] for x in denied)
        assert all(not x["allowed"] for x in denied)
        first = sb.egress(limit=1)
        assert len(first) == 1 and first[0]["seq"] == records[0]["seq"]
        followed = sb.follow_egress()
        assert next(followed)["seq"] == records[0]["seq"]
        followed.close()
        sb.set_network("none")
        assert sb.info.raw["network"]["mode"] == "none"
        assert sb.exec(f"curl -sS -m 5 {WEB}").exit_code != 0
        sb.set_network(allow=["203.0.113.10/32"])
        assert sb.exec(f"curl -sS -m 5 {WEB}").exit_code == 0


def test_bad_policies_name_the_field(client: Berth) -> None:
    with pytest.raises(InvalidArgument) as exc:
        client.create(allow=["*.com"])
    assert "network.allow[0]" in exc.value.message
    with pytest.raises(InvalidArgument) as exc:
        client.create(network={"mode": "open", "secrets": [{"secret": "nope", "host": "api.example.com", "header": "X"}]})
    assert "network.secrets[0].secret" in exc.value.message


def test_secrets_never_come_back(client: Berth) -> None:
    client.create_secret("sdk-key", "sk-sdk-0123456789")
    try:
        listed = [s for s in client.list_secrets() if s["name"] == "sdk-key"]
        assert listed and "value" not in listed[0]
        client.update_secret("sdk-key", "sk-sdk-9876543210")
        policy = {"mode": "open", "secrets": [{"secret": "sdk-key", "host": "api.example.com", "env": "SDK_KEY"}]}
        with client.create(network=policy) as sb:
            ph = sb.info.raw["network"]["secrets"][0]["placeholder"]
            assert ph.startswith("berth-ph-")
            assert sb.exec("echo $SDK_KEY").stdout.strip() == ph
            with pytest.raises(Conflict) as exc:
                client.delete_secret("sdk-key")
            assert sb.id in exc.value.message
    finally:
        client.delete_secret("sdk-key")
    with pytest.raises(NotFound):
        client.update_secret("sdk-key", "x")


def test_deepagents_factory_with_a_network(client: Berth) -> None:
    backend = BerthSandbox.create(client, allow=["203.0.113.10/32"])
    try:
        r = backend.execute(f"curl -sS -m 5 {WEB}")
        assert r.exit_code == 0 and r.output == "hello from the test net\n"
    finally:
        backend.sandbox.delete()


def test_async_network(berth_url: str) -> None:
    async def main() -> None:
        async with AsyncBerth(berth_url) as c:
            await c.create_secret("sdk-async", "v-0123456789")
            assert any(s["name"] == "sdk-async" for s in await c.list_secrets())
            await c.delete_secret("sdk-async")
            async with await c.create(network="open") as sb:
                r = await sb.exec(f"curl -sS -m 5 {WEB}")
                assert r.exit_code == 0
                assert any(x["allowed"] for x in await sb.egress())
                await sb.set_network("none")

    asyncio.run(main())


def test_gvisor_link_comes_at_boot(client: Berth) -> None:
    caps = next(r for r in client.runtimes() if r["name"] == "gvisor")["capabilities"]
    assert "open" in caps["network_modes"] and "allowlist" in caps["network_modes"]
    with client.create(network="open", runtime="gvisor") as sb:
        assert sb.exec(f"curl -sS -m 5 {WEB}").stdout == "hello from the test net\n"
    with client.create(runtime="gvisor") as sb, pytest.raises(NotImplementedByRuntime) as exc:
        sb.set_network("open")
    assert "boots" in exc.value.message
