"""API keys against the real daemon, with the sync and the async client: a
missing or wrong key is Unauthenticated (and says nothing of any sandbox),
keys made through the API act for their tenant and scope, a revoked key is
refused at once, and the audit log names who did what."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from _over_async import Over

from berth import APIKey, AsyncSandbox, Berth, InvalidArgument, NotFound, PermissionDenied, Sandbox, SandboxInfo, Unauthenticated

# Well formed (berth_, a 12-hex-digit id, _, 64 hex digits) but never made.
UNKNOWN_KEY = "berth_" + "0" * 12 + "_" + "0" * 64


def handle(c: Berth, info: SandboxInfo) -> Sandbox:
    """A handle on a sandbox through client c without asking the daemon
    (as Berth.get would, which c may not be allowed to)."""
    if isinstance(c, Over):
        return Over(AsyncSandbox(c._target, info), c._loop)  # type: ignore[return-value]
    return Sandbox(c, info)


def _name(what: str) -> str:
    return f"sdk-test-{what}-{os.getpid()}"


def test_no_key_is_unauthenticated_and_names_no_sandbox(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    anonymous = client_with(None)
    with client.create() as sb:
        calls = {
            "get": lambda: anonymous.get(sb.id),
            "list": lambda: anonymous.list(),
            "create": lambda: anonymous.create(),
            "delete": lambda: anonymous.delete(sb.id),
            # a streamed answer, a download and a WebSocket's handshake
            "exec_stream": lambda: list(handle(anonymous, sb.info).exec_stream("true")),
            "download": lambda: handle(anonymous, sb.info).download("/etc/hostname"),
            "open_terminal": lambda: handle(anonymous, sb.info).open_terminal(["true"]),
        }
        for what, call in calls.items():
            with pytest.raises(Unauthenticated) as e:
                call()
            assert e.value.status == 401, what
            assert e.value.error_class == "unauthenticated"
            assert "API key" in e.value.message, (what, e.value.message)
            assert sb.id not in e.value.message, (what, e.value.message)
        # The sandbox is untouched, and the key the client has works.
        assert client.get(sb.id).info.state == "running"


def test_wrong_key_is_unauthenticated(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    with client.create() as sb:
        for key in (UNKNOWN_KEY, "not-a-berth-key", UNKNOWN_KEY[:-1] + "1"):
            wrong = client_with(key)
            with pytest.raises(Unauthenticated) as e:
                wrong.get(sb.id)
            assert e.value.status == 401
            assert sb.id not in e.value.message
            with pytest.raises(Unauthenticated):
                handle(wrong, sb.info).open_terminal(["true"])


def test_a_tenant_sees_only_its_own_sandboxes(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    ka = client.create_api_key("t-a", scope="write", name=_name("a"))
    kb = client.create_api_key("t-b", name=_name("b"))
    assert (ka.tenant, ka.scope) == ("t-a", "write")
    assert (kb.tenant, kb.scope) == ("t-b", "write")  # write is the default
    assert ka.key.startswith("berth_" + ka.id + "_") and ka.key not in repr(ka)
    a, b = client_with(ka.key), client_with(kb.key)
    with b.create(labels={"who": "b"}) as sb:
        assert b.get(sb.id).id == sb.id
        assert sb.id in [s.id for s in b.list()]
        # Another tenant's sandbox is not found, whatever the call.
        with pytest.raises(NotFound) as e:
            a.get(sb.id)
        assert e.value.status == 404
        with pytest.raises(NotFound):
            a.delete(sb.id)
        with pytest.raises(NotFound):
            handle(a, sb.info).exec("true")
        with pytest.raises(NotFound):
            handle(a, sb.info).open_terminal(["true"])
        assert sb.id not in [s.id for s in a.list()]
        # The operator (the admin key) sees every tenant's.
        assert client.get(sb.id).id == sb.id
        with a.create() as mine:
            assert mine.id in [s.id for s in a.list()]
            assert mine.id not in [s.id for s in b.list()]
        # The audit log names the tenant and the key of the create.
        made = [r for r in client.audit(sandbox=sb.id) if r.method == "POST" and r.route == "/v1/sandboxes"]
        assert [(r.tenant, r.key_id, r.status) for r in made] == [("t-b", kb.id, 201)], made
        # A tenant reads its own calls only: of b's sandbox, a sees just its
        # own refused ones.
        assert {r.tenant for r in b.audit()} == {"t-b"}
        assert b.audit(sandbox=sb.id)
        refused = a.audit(sandbox=sb.id)
        assert [(r.method, r.tenant, r.key_id, r.status, r.error) for r in refused if r.method == "DELETE"] == [
            ("DELETE", "t-a", ka.id, 404, "not_found")
        ], refused
        assert all(r.tenant == "t-a" and r.error == "not_found" for r in refused), refused


def test_a_read_key_cannot_create(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    kr = client.create_api_key("t-a", scope="read", name=_name("read"))
    assert kr.scope == "read"
    reader = client_with(kr.key)
    assert isinstance(reader.list(), list)
    with pytest.raises(PermissionDenied) as e:
        reader.create()
    assert e.value.status == 403
    assert e.value.error_class == "permission_denied"
    assert "scope read" in e.value.message and "write" in e.value.message, e.value.message
    # Nor may a tenant's write key make keys: that is an admin key's call.
    kw = client.create_api_key("t-a", name=_name("write"))
    with pytest.raises(PermissionDenied):
        client_with(kw.key).create_api_key("t-a")
    with pytest.raises(PermissionDenied):
        reader.list_api_keys()


def test_a_revoked_key_is_refused_at_once(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    k = client.create_api_key("t-a", name=_name("revoked"))
    c = client_with(k.key)
    assert isinstance(c.list(), list)
    revoked = client.revoke_api_key(k)
    assert revoked.id == k.id and revoked.revoked and revoked.key == ""
    with pytest.raises(Unauthenticated):
        c.list()
    listed = {x.id: x for x in client.list_api_keys()}
    assert isinstance(listed[k.id], APIKey)
    assert listed[k.id].revoked_at and all(x.key == "" for x in listed.values())
    with pytest.raises(NotFound):
        client.revoke_api_key("000000000000")


def test_the_admin_key_given_explicitly(admin_key: str, client_with: Callable[[str | None], Berth]) -> None:
    assert admin_key == os.environ["BERTH_API_KEY"]
    admin = client_with(admin_key)
    ids = [k.id for k in admin.list_api_keys()]
    assert admin_key.startswith("berth_" + ids[0] + "_")  # the daemon's first key, listed first


def test_key_arguments_are_checked(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    with pytest.raises(InvalidArgument) as e:
        client.create_api_key("t-a", expires_at=datetime(2030, 1, 1))  # noqa: DTZ001 (the point)
    assert "expires_at" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        client.create_api_key("Not A Label")
    assert "tenant" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        client.revoke_api_key("")
    assert "key" in e.value.message
    # A key with an expiry works until then.
    k = client.create_api_key("t-a", name=_name("expiring"), expires_at=datetime.now(timezone.utc) + timedelta(hours=1))
    assert k.expires_at
    assert isinstance(client_with(k.key).list(), list)
