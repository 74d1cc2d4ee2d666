"""Tenants' quotas and usage against the real daemon, with the sync and the
async client: the operator's quota bounds what a tenant's key may create,
a tenant reads its own usage only and may not set its quota, and bad
arguments are refused before any request."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator

import pytest

from _over_async import Over

from berth import (
    AsyncBerth,
    Berth,
    DaemonUnreachable,
    InvalidArgument,
    PermissionDenied,
    Quota,
    ResourceExhausted,
    TenantUsage,
)

TENANT = "q-a"


@pytest.fixture
def unreachable(client: Berth) -> Iterator[Berth]:
    """A client of `client`'s kind whose URL no daemon answers: any request
    it sends fails with DaemonUnreachable, so another error is the SDK's own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again before use
    c: Berth = Over(AsyncBerth(url), client._loop) if isinstance(client, Over) else Berth(url)  # type: ignore[assignment]
    yield c
    c.close()


def test_a_quota_bounds_a_tenants_sandboxes(client: Berth, client_with: Callable[[str | None], Berth]) -> None:
    key = client.create_api_key(TENANT, name=f"sdk-test-quota-{os.getpid()}")
    try:
        u = client.set_quota(TENANT, sandboxes=1)
        assert isinstance(u, TenantUsage)
        assert (u.tenant, u.quota, u.sandboxes) == (TENANT, Quota(sandboxes=1), 0), u
        a = client_with(key.key)
        with a.create() as sb:
            with pytest.raises(ResourceExhausted) as e:
                a.create()
            assert e.value.error_class == "resource_exhausted"
            assert "sandboxes" in e.value.message and TENANT in e.value.message, e.value.message
            # The tenant's key reads its own usage, one entry, whatever tenant it names.
            for mine in (a.usage(), a.usage("t-b")):
                assert [(x.tenant, x.sandboxes, x.quota.sandboxes) for x in mine] == [(TENANT, 1, 1)], mine
                assert isinstance(mine[0], TenantUsage)
            # The operator reads every tenant's, or one's.
            every = {x.tenant: x for x in client.usage()}
            assert TENANT in every and every[TENANT].sandboxes == 1, every
            assert [(x.tenant, x.sandboxes) for x in client.usage(TENANT)] == [(TENANT, 1)]
            # Setting a quota is the operator's call.
            with pytest.raises(PermissionDenied) as e:
                a.set_quota(TENANT, sandboxes=5)
            assert e.value.status == 403
            assert sb.id in [s.id for s in a.list()]
        # An all-zero quota removes it.
        u = client.set_quota(TENANT)
        assert (u.quota, u.sandboxes) == (Quota(), 0), u
    finally:
        client.set_quota(TENANT)
        client.revoke_api_key(key)


def test_quota_arguments_are_checked_before_any_request(client: Berth, unreachable: Berth) -> None:
    with pytest.raises(DaemonUnreachable):  # what a request from this client gets
        unreachable.usage()
    bad: list[tuple[str, Callable[[], object]]] = [
        ("tenant", lambda: unreachable.set_quota("", sandboxes=1)),
        ("tenant", lambda: unreachable.set_quota(None, sandboxes=1)),  # type: ignore[arg-type]
        ("tenant", lambda: unreachable.usage("")),
        ("sandboxes", lambda: unreachable.set_quota(TENANT, sandboxes=-1)),
        ("sandboxes", lambda: unreachable.set_quota(TENANT, sandboxes=1.5)),  # type: ignore[arg-type]
        ("sandboxes", lambda: unreachable.set_quota(TENANT, sandboxes=True)),
        ("cpus", lambda: unreachable.set_quota(TENANT, cpus=-0.5)),
        ("cpus", lambda: unreachable.set_quota(TENANT, cpus=float("nan"))),
        ("memory_bytes", lambda: unreachable.set_quota(TENANT, memory_bytes=-5)),
        ("disk_bytes", lambda: unreachable.set_quota(TENANT, disk_bytes=-1)),
        ("snapshot_bytes", lambda: unreachable.set_quota(TENANT, snapshot_bytes="1")),  # type: ignore[arg-type]
    ]
    for name, call in bad:
        with pytest.raises(InvalidArgument) as e:
            call()
        assert e.value.message.startswith(name + ":"), (name, e.value.message)
    # What only the daemon knows, it says: a tenant's name is a DNS label.
    with pytest.raises(InvalidArgument) as e:
        client.set_quota("Not_A_Label", sandboxes=1)
    assert e.value.message.startswith("tenant"), e.value.message
    # Every bound at once, and a fractional CPU count, come back as set.
    try:
        q = Quota(sandboxes=3, cpus=1.5, memory_bytes=1 << 30, disk_bytes=2 << 30, snapshot_bytes=1 << 20)
        assert client.set_quota("q-b", **vars(q)).quota == q
    finally:
        client.set_quota("q-b")
